"""smdebug: capture tensors while a model trains, read them back, run rules on them.

Framework hooks live in separately installed plugins and are imported as ``smdebug.<alias>``
(``smdebug.pytorch``, ``smdebug.xgboost``, ...); see ``smdebug.plugins``.
"""

from importlib import import_module

from smdebug import _alias, modes

__version__ = "0.1.0"

_LAZY = {
    "SaveConfig": "smdebug.config",
    "SaveConfigMode": "smdebug.config",
    "ReductionConfig": "smdebug.config",
    "Collection": "smdebug.collection",
    "CollectionKeys": "smdebug.collection",
    "create_trial": "smdebug.trials",
    "BaseHook": "smdebug.hook",
}

__all__ = ["modes", *_LAZY]

_alias.install()


def __getattr__(name):
    # Lazy so that `import smdebug` stays cheap; `smdebug.pytorch` as an attribute imports the plugin.
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if not name.startswith("_"):
        try:
            return import_module(f"smdebug.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"smdebug.{name}":
                raise
    raise AttributeError(f"module 'smdebug' has no attribute {name!r}")
