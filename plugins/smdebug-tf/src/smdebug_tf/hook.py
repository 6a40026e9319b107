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

    @classmethod
    def activated_as(cls, hook):
        from smdebug_tf.activation import upgrade

        upgrade()  # the hook activated on import may still be a TFHook: now a KerasHook
        return super().activated_as(hook)


Hook = KerasHook  # smdebug 1.0 spells it smd.KerasHook; smd.Hook is every other framework's name


class EstimatorHook:
    """tf.estimator left TensorFlow in 2.16: this class only says what to use instead."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "smdebug.tensorflow.EstimatorHook served tf.estimator, which TensorFlow 2.16+ no longer has: "
            "use smd.KerasHook as a callback of model.fit/evaluate/predict, hook.wrap_tape(tf.GradientTape()) "
            "in a custom training loop, or smd.SessionHook with tf.compat.v1.train.MonitoredTrainingSession"
        )

    @classmethod
    def create_from_json_file(cls, json_file_path=None):
        return cls()
