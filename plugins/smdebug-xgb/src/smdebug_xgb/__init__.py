"""smdebug for XGBoost, also importable as ``smdebug.xgboost``.

    import smdebug.xgboost as smd
    hook = smd.Hook(out_dir="/tmp/run", include_collections=["metrics", "feature_importance"])
    xgboost.train(params, dtrain, evals=[(dval, "validation")], callbacks=[hook])

Names are resolved on first use (xgboost with ``Hook``), not by importing this package: the plugin's
entry point (``smdebug_xgb.plugin``) lives inside it and must stay cheap to load.
"""

from importlib import import_module

from smdebug import modes

_LAZY = {
    "Hook": "smdebug_xgb.hook",
    "Collection": "smdebug.collection",
    "CollectionKeys": "smdebug.collection",
    "SaveConfig": "smdebug.config",
    "SaveConfigMode": "smdebug.config",
    "ReductionConfig": "smdebug.config",
    "create_trial": "smdebug.trials",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'smdebug_xgb' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def get_hook(json_config_path=None, create_if_not_exists: bool = False):
    """The XGBoost hook in use (the last one created); with create_if_not_exists, one is created from
    the JSON configuration (``json_config_path``, ``SMDEBUG_CONFIG_FILE_PATH`` or SageMaker's path)
    when there is one."""
    from smdebug import hook as core_hook
    from smdebug_xgb.hook import Hook

    current = core_hook.get_hook()
    if isinstance(current, Hook):
        return current
    if create_if_not_exists:
        return Hook.create_from_json_file(json_config_path)
    return None


__all__ = [
    "Hook",
    "Collection",
    "CollectionKeys",
    "SaveConfig",
    "SaveConfigMode",
    "ReductionConfig",
    "modes",
    "create_trial",
    "get_hook",
]
