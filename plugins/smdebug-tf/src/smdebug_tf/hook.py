"""KerasHook: a Keras 3 callback for fit, evaluate and predict, plus GradientTape loops (wrap_tape).

The behaviour is TFHook's (smdebug_tf.tfhook); this class adds keras.callbacks.Callback as a base.
"""

from __future__ import annotations

import keras

from smdebug_tf.tfhook import TFHook


class KerasHook(TFHook, keras.callbacks.Callback):
    def setup(self) -> None:
        super().setup()
        keras.callbacks.Callback.__init__(self)

    def set_model(self, model) -> None:
        keras.callbacks.Callback.set_model(self, model)
        super().set_model(model)


Hook = KerasHook  # smdebug 1.0 spells it smd.KerasHook; smd.Hook is every other framework's name


class _TF1Hook:
    """TF 1.x hook classes: gone with tf.estimator and tf.compat.v1 sessions (TF 2.16+ has neither)."""

    interface = ""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"smdebug.tensorflow.{type(self).__name__} served TF 1.x {self.interface}, which TensorFlow "
            "2.16+ no longer has: use smd.KerasHook as a callback of model.fit/evaluate/predict, or "
            "hook.wrap_tape(tf.GradientTape()) in a custom training loop"
        )

    @classmethod
    def create_from_json_file(cls, json_file_path=None):
        return cls()


class SessionHook(_TF1Hook):
    interface = "tf.train.MonitoredSession"


class EstimatorHook(_TF1Hook):
    interface = "tf.estimator"
