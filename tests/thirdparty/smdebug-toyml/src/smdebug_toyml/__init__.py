"""smdebug for toyml, also importable as ``smdebug.toyml``.

    import smdebug.toyml as smd
    hook = smd.Hook(out_dir="/tmp/run", save_config=smd.SaveConfig(save_interval=1))
    toyml.fit(model, x, y, callbacks=[hook])

Names resolve on first use, so that the entry point (``smdebug_toyml.plugin``) stays cheap to load.
"""

from importlib import import_module

from smdebug import modes

_LAZY = {
    "Hook": "smdebug_toyml.hook",
    "SaveConfig": "smdebug.config",
    "ReductionConfig": "smdebug.config",
    "CollectionKeys": "smdebug.collection",
    "create_trial": "smdebug.trials",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'smdebug_toyml' has no attribute {name!r}")


def get_hook():
    """The toyml hook in use (the one activated on ``import toyml``, or the last one created)."""
    from smdebug import hook as core_hook
    from smdebug_toyml.hook import Hook

    current = core_hook.get_hook()
    return current if isinstance(current, Hook) else None


__all__ = ["Hook", "SaveConfig", "ReductionConfig", "CollectionKeys", "create_trial", "get_hook", "modes"]
