"""Everything a framework plugin imports, in one place (docs/writing-a-plugin.md).

    from smdebug.plugin import BaseHook, CollectionKeys, Framework, exports, hookimpl

A plugin uses only these names and the public members of BaseHook; the rest of the core may change.
``hookimpl`` and ``Framework`` are light; the other names load on first use, so a plugin's entry-point
module (imported at every configured interpreter start) costs nothing more than pluggy.
"""

from importlib import import_module

from smdebug.hookspecs import Framework, hookimpl

_LAZY = {
    "BaseHook": "smdebug.hook",
    "get_hook": "smdebug.hook",
    "HookConfig": "smdebug.config",
    "SaveConfig": "smdebug.config",
    "SaveConfigMode": "smdebug.config",
    "ReductionConfig": "smdebug.config",
    "Collection": "smdebug.collection",
    "CollectionKeys": "smdebug.collection",
    "INPUT_SUFFIX": "smdebug.collection",
    "OUTPUT_SUFFIX": "smdebug.collection",
    "layer_tensor_patterns": "smdebug.collection",
    "ModeKeys": "smdebug.modes",
    "ConfigError": "smdebug.exceptions",
    "SMDebugTypeError": "smdebug.exceptions",
    "StopTraining": "smdebug.exceptions",
    "exports": "smdebug.framework_api",
    "after_import": "smdebug.activation",
}

__all__ = ["Framework", "hookimpl", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'smdebug.plugin' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
