"""smdebug for TensorFlow 2 / Keras 3, also importable as ``smdebug.tensorflow``.

import smdebug.tensorflow as smd
hook = smd.KerasHook(out_dir="/tmp/run")
model.fit(x, y, callbacks=[hook])
"""

from smdebug.plugin import exports

# KerasHook, SaveConfig, create_trial, ... resolve on first use: importing this package imports no TensorFlow.
__getattr__, __dir__, get_hook, __all__ = exports(
    __name__,
    "smdebug_tf.hook",
    {"keras": "KerasHook", "session": "SessionHook", "estimator": "EstimatorHook"},
    Collection="smdebug_tf.collection",
    KerasHook="smdebug_tf.hook",
    SessionHook="smdebug_tf.session",
    EstimatorHook="smdebug_tf.hook",
)
