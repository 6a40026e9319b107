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


def exports(package: str, hook_module: str, hook_types: dict[str, str] | None = None, **overrides: str):
    """``(__getattr__, __dir__, get_hook, __all__)`` for a plugin package whose Hook is in hook_module;
    overrides maps a name to the module that holds the plugin's own version (e.g. its Collection).
    hook_types (TensorFlow's: ``{"session": "SessionHook", ...}``) gives get_hook smdebug 1.0's
    ``hook_type`` first argument, naming one of the package's hook classes. ``set_hook`` and ``del_hook``
    are served too."""
    lazy = {**COMMON, "Hook": hook_module, **overrides}

    def __getattr__(name):
        if name in lazy:
            return getattr(import_module(lazy[name]), name)
        if name in _HOOK_FUNCTIONS:
            return _HOOK_FUNCTIONS[name]
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(lazy) | set(_HOOK_FUNCTIONS))

    def hook_of(hook_type, json_config_path, create_if_not_exists):
        from smdebug import hook as core_hook

        if hook_type is None:  # any hook of this framework; a new one is the package's Hook
            hook_class = __getattr__("Hook")
            matches = getattr(core_hook.get_hook(), "framework", None) == hook_class.framework
        elif hook_type in (hook_types or {}):
            hook_class = __getattr__(hook_types[hook_type])
            matches = isinstance(core_hook.get_hook(), hook_class)
        else:
            raise ValueError(
                f"get_hook: hook_type must be one of {sorted(hook_types or {})}, got {hook_type!r}"
            )
        if matches:
            return core_hook.get_hook()
        if create_if_not_exists:
            return hook_class.create_from_json_file(json_config_path)
        return None

    if hook_types:

        def get_hook(hook_type: str | None = None, json_config_path=None, create_if_not_exists: bool = False):
            """The hook in use (the last one created, or the one activated on import), of the kind
            hook_type names (any when None); with create_if_not_exists, one of that kind is created from
            the JSON configuration (json_config_path, SMDEBUG_CONFIG_FILE_PATH or SageMaker's path) when
            there is one."""
            return hook_of(hook_type, json_config_path, create_if_not_exists)

    else:

        def get_hook(json_config_path=None, create_if_not_exists: bool = False):
            """The hook in use (the last one created, or the one activated on import); with
            create_if_not_exists, one is created from the JSON configuration (json_config_path,
            SMDEBUG_CONFIG_FILE_PATH or SageMaker's path) when there is one."""
            return hook_of(None, json_config_path, create_if_not_exists)

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
