"""smdebug for TensorFlow 2 / Keras 3, also importable as ``smdebug.tensorflow``.

import smdebug.tensorflow as smd
hook = smd.KerasHook(out_dir="/tmp/run")
model.fit(x, y, callbacks=[hook])
"""

import sys

from smdebug.plugin import exports

# KerasHook, SaveConfig, create_trial, ... resolve on first use: importing this package imports no TensorFlow.
__getattr__, __dir__, _get_hook, __all__ = exports(
    __name__,
    "smdebug_tf.hook",
    {"keras": "KerasHook", "session": "SessionHook", "estimator": "EstimatorHook"},
    Collection="smdebug_tf.collection",
    KerasHook="smdebug_tf.hook",
    SessionHook="smdebug_tf.session",
    EstimatorHook="smdebug_tf.hook",
)


def get_hook(hook_type: str | None = None, json_config_path=None, create_if_not_exists: bool = False):
    """The hook in use, of the kind hook_type names ("keras", "session", "estimator"; any when None); with
    create_if_not_exists, one is created from the JSON configuration when there is one. With a
    configuration the hook activated on import is the one asked for (a SessionHook once "session" is)."""
    if hook_type == "session" and "tensorflow" in sys.modules:
        from smdebug_tf.activation import session_hook_asked

        session_hook_asked()
    return _get_hook(hook_type, json_config_path, create_if_not_exists)
