"""Always-on health for Keras (``KerasHook(health=True)``): every training step's statistics into the
core's flight recorder (smdebug.health), and where the first non-finite value came from.

Every training step runs the hook's instrumented step (smdebug_tf.capture, HEALTH kind): in the same
compiled graph as Keras' own step (XLA included), the l2 norm and the max |x| of every weight (as the step
starts), every gradient (as the optimizer receives it) and the batch's loss, plus one "all finite" flag per
input and per layer output, in the order the step computed them, all stacked into one float32 vector. The
host takes that vector over once (one transfer) into the recorder's row and the monitor judges it.

Provenance needs no re-run: the step's flags already say whether the input batch or which layer's output
held the first non-finite value (the earliest in the step's order); else the loss; else the gradient the
backward pass met first (the one nearest the output).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

ABSENT = -1.0  # a tensor the step did not have (no gradient): norms are never negative (smdebug.health)
LOSS = "loss"  # Keras' name of the loss in its logs


# -- in the compiled step ------------------------------------------------------------------------------
def finite_flag(value) -> tf.Tensor:
    """1.0 when every floating value of a (nested) value is finite, else 0.0 (a float32 scalar)."""
    leaves = [
        tf.convert_to_tensor(t) for t in tf.nest.flatten(value) if isinstance(t, (tf.Tensor, tf.Variable))
    ]
    checks = [tf.reduce_all(tf.math.is_finite(t)) for t in leaves if t.dtype.is_floating]
    if not checks:
        return tf.constant(1.0)
    return tf.cast(tf.reduce_all(tf.stack(checks)), tf.float32)


def statistics(tensors: list, flags: list) -> tf.Tensor:
    """One float32 vector: the l2 norms of ``tensors``, their max |x| (ABSENT for a None), then ``flags``."""
    norms, maxes = [], []
    for t in tensors:
        if t is None or not t.dtype.is_floating or t.shape.num_elements() == 0:
            norms.append(tf.constant(ABSENT))
            maxes.append(tf.constant(ABSENT))
            continue
        t = tf.cast(tf.reshape(t, [-1]), tf.float32)
        norm = tf.norm(t)
        # a NaN anywhere makes the norm NaN; the max as well (a reduce_max may skip NaN)
        maxes.append(tf.where(tf.math.is_nan(norm), norm, tf.reduce_max(tf.abs(t))))
        norms.append(norm)
    return tf.stack(norms + maxes + list(flags))


# -- on the host ---------------------------------------------------------------------------------------
class KerasHealth:
    """The Keras hook's part of health monitoring (``hook.health`` is the core's HealthMonitor)."""

    def __init__(self, hook):
        self.hook = hook
        self.monitor = hook.health

    def record(self, vector, layout: tuple, kept: dict | None = None, logs=None) -> None:
        """A step's statistics (the instrumented step's health vector; ``layout`` is ``(names, flags)``
        as the step was traced: flags are ``(direction, module, tensor)``). On a trigger, ``kept`` (the
        step's in-graph tensors the user's collections name) and the step's ``logs`` are saved."""
        names, flags = layout
        if not names:
            return
        n = len(names)
        host = vector.numpy() if hasattr(vector, "numpy") else np.asarray(vector, dtype=np.float32)
        monitor = self.monitor
        ring = monitor.track(names, LOSS, lambda rows, columns: np.full((rows, columns), ABSENT, np.float32))
        slot = monitor.row()
        ring[slot] = host[: 2 * n]
        triggers = len(monitor.triggers)
        hook = self.hook
        if monitor.check(slot, ring[slot]):
            where = self._where(ring[slot], host[2 * n :], flags)
            monitor.found({"step": hook.step, "mode": hook.mode.name, "mode_step": hook.mode_step, **where})
        if len(monitor.triggers) > triggers:  # the first non-finite value, or a loss spike
            with hook.guard("save the step's tensors"):
                logs = logs if isinstance(logs, dict) else {}  # (predict returns the predictions)
                self._save_step({**logs, **(kept or {})})

    def _save_step(self, tensors: dict) -> None:
        """The triggering step's tensors the user's collections name, saved as those collections save
        (those the step saved already aside)."""
        hook = self.hook
        for name, value in tensors.items():
            if hook.is_due(name):
                continue
            collections = [c.name for c in hook.collections_of(name)]
            if collections:
                hook.save_tensor(name, value, collections)

    def _where(self, row, flag_values, flags) -> dict:
        """The first non-finite value of the step: the first bad flag (input, then the layers in the order
        they ran), else the loss, else the gradient nearest the output, else a weight."""
        for value, (direction, module, tensor) in zip(flag_values, flags):
            if value != 1.0:
                return _where(direction, module, tensor)
        bad = self.monitor.nonfinite_names(row)
        model = self.hook.tf_state.model
        if LOSS in bad:
            return _where("loss", getattr(model, "name", LOSS), LOSS)
        grads = [name for name in bad if name.startswith("gradients/")]
        name = grads[-1] if grads else (bad[0] if bad else "")
        return _where("backward", self._owner(name), name)

    def _owner(self, tensor: str) -> str:
        """The layer holding the variable of a weight or gradient name."""
        from smdebug_tf import capture

        model = self.hook.tf_state.model
        if model is not None:
            for layer in reversed(capture.walk_layers(model)):  # the innermost layer owning it
                for variable in layer.weights:
                    path = capture.variable_name(variable)
                    if tensor in (path, capture.gradient_name(variable)):
                        return layer.name
        return tensor


def _where(direction: str, module: str, tensor: str) -> dict:
    return {"direction": direction, "module": module, "tensor": tensor}
