"""``import smdebug.<alias>[.sub]`` resolves to the package of the plugin declaring that alias.

The alias and the real package are the same module objects (``smdebug.pytorch.Hook is
smdebug_torch.Hook``), so there is never a second copy of a plugin's classes.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

_PREFIX = "smdebug."


def _core_has(name: str) -> bool:
    here = os.path.dirname(__file__)
    return os.path.isdir(os.path.join(here, name)) or os.path.isfile(os.path.join(here, name + ".py"))


# plain classes: importlib only needs the methods, and importlib.abc costs ~10 ms of imports
class _AliasLoader:
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._real_spec  # importlib stamped the alias spec on the real module


class _AliasFinder:
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX):
            return None
        parts = fullname.split(".")
        alias = parts[1]
        if _core_has(alias):
            return None
        target = ".".join([_package_for(alias), *parts[2:]])
        spec = importlib.util.find_spec(target)
        if spec is None:
            return None
        is_package = spec.submodule_search_locations is not None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(target), is_package=is_package)


def _package_for(alias: str) -> str:
    from smdebug import plugins

    fw = plugins.frameworks().get(alias)
    if fw is not None:
        return fw.package
    name = f"smdebug.{alias}"
    if alias in plugins.load_errors:
        raise ModuleNotFoundError(
            f"No module named {name!r}: the installed plugin {alias!r} failed to load: "
            f"{plugins.load_errors[alias]}",
            name=name,
        )
    dist = plugins.KNOWN_ALIASES.get(alias)
    hint = (
        f"install {dist}, e.g. pip install ./plugins/{dist} from the smdebug source tree"
        if dist
        else "install the plugin distribution that provides it"
    )
    raise ModuleNotFoundError(
        f"No module named {name!r}: no installed smdebug plugin declares the alias {alias!r} ({hint})",
        name=name,
    )


_finder = _AliasFinder()


def install() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
