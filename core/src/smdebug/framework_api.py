"""The names every framework plugin's package offers as ``smdebug.<alias>`` (smdebug 1.0's API per framework).

A plugin's ``__init__.py`` is then two lines (see plugins/smdebug-torch)::

    from smdebug.plugin import exports

    __getattr__, __dir__, get_hook, __all__ = exports(__name__, "smdebug_torch.hook")

Names resolve on first use, so importing the package (where the plugin's entry point lives) stays cheap
and does not import the framework.
"""

from __future__ import annotations

import sys
from importlib import import_module

COMMON = {
    "Collection": "smdebug.collection",
    "CollectionKeys": "smdebug.collection",
    "SaveConfig": "smdebug.config",
    "SaveConfigMode": "smdebug.config",
    "ReductionConfig": "smdebug.config",
    "create_trial": "smdebug.trials",
    "modes": "smdebug",
}


def exports(package: str, hook_module: str, **overrides: str):
    """``(__getattr__, __dir__, get_hook, __all__)`` for a plugin package whose Hook is in hook_module;
    overrides maps a name to the module that holds the plugin's own version (e.g. its Collection).
    ``set_hook`` and ``del_hook`` are served too."""
    lazy = {**COMMON, "Hook": hook_module, **overrides}

    def __getattr__(name):
        if name in lazy:
            return getattr(import_module(lazy[name]), name)
        if name in _HOOK_FUNCTIONS:
            return _HOOK_FUNCTIONS[name]
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(lazy) | set(_HOOK_FUNCTIONS))

    def get_hook(json_config_path=None, create_if_not_exists: bool = False):
        """The hook in use (the last one created, or the one activated on import); with
        create_if_not_exists, one is created from the JSON configuration (json_config_path,
        SMDEBUG_CONFIG_FILE_PATH or SageMaker's path) when there is one."""
        from smdebug import hook as core_hook

        hook_class = __getattr__("Hook")
        current = core_hook.get_hook()
        if isinstance(current, hook_class):
            return current
        if create_if_not_exists:
            return hook_class.create_from_json_file(json_config_path)
        return None

    return __getattr__, __dir__, get_hook, [*lazy, "get_hook", *_HOOK_FUNCTIONS]


def set_hook(custom_hook) -> None:
    """Make ``custom_hook`` the hook ``get_hook`` returns (smdebug 1.0's singleton)."""
    from smdebug import hook as core_hook

    core_hook.set_hook(custom_hook)


def del_hook() -> None:
    """Forget the hook ``get_hook`` returns."""
    from smdebug import hook as core_hook

    core_hook.set_hook(None)


_HOOK_FUNCTIONS = {"set_hook": set_hook, "del_hook": del_hook}
