"""Always-on health for Keras (``KerasHook(health=True)``): every training step's statistics into the
core's flight recorder (smdebug.health), and where the first non-finite value came from.

Every step, in every mode, runs the hook's instrumented step (smdebug_tf.capture, HEALTH kind): in the
same compiled graph as Keras' own step (XLA included), the l2 norm and the max |x| of every weight (as the
step starts), every gradient (as the optimizer receives it; TRAIN only) and the batch's loss, plus one
"all finite" flag per input and per layer output, in the order the step computed them, all stacked into
one float32 vector. The host takes that vector over once (one transfer) into the recorder's row and the
monitor judges it. The step also returns, as references (nothing is copied or fetched), its tensors that
the user's collections name; they are read and saved only when the step triggers the recorder.

Provenance needs no re-run: the step's flags already say whether the input batch or which layer's output
held the first non-finite value (the earliest in the step's order); else the loss; else the gradient the
backward pass met first (the one nearest the output).
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf

logger = logging.getLogger("smdebug")

ABSENT = -1.0  # a tensor the step did not have (no gradient): norms are never negative (smdebug.health)
LOSS = "loss"  # Keras' name of the loss in its logs


# -- in the compiled step ------------------------------------------------------------------------------
def finite_flags(named: list[tuple[str, tf.Tensor]]) -> list[tuple[str, tf.Tensor]]:
    """An "all finite" flag (a bool scalar) for each floating tensor of ``(name, tensor)`` pairs
    (capture.named_tensors: named as the saved tensors are)."""
    return [(n, tf.reduce_all(tf.math.is_finite(t))) for n, t in named if t.dtype.is_floating]


def statistics(tensors: list, flags: list) -> tf.Tensor:
    """One float32 vector: the l2 norms of ``tensors``, their max |x| (ABSENT for a None), then ``flags``.
    Three ops a tensor: TF's graph executor costs more per op than these small reductions do."""
    halves, maxes, present = [], [], []
    for t in tensors:
        if t is None or not t.dtype.is_floating or t.shape.num_elements() == 0:
            present.append(False)
            continue
        present.append(True)
        if t.dtype != tf.float32:
            t = tf.cast(t, tf.float32)
        halves.append(tf.nn.l2_loss(t))  # sum(t ** 2) / 2 in one kernel
        maxes.append(tf.reduce_max(tf.abs(t)))
    full = tf.fill([len(present)], ABSENT)
    norms = maxes_ = full
    if halves:
        norms = tf.sqrt(2.0 * tf.stack(halves))
        # a NaN anywhere makes the norm NaN; the max as well (a reduce_max may skip NaN)
        maxes_ = tf.where(tf.math.is_nan(norms), norms, tf.stack(maxes))
        if not all(present):  # ABSENT for the tensors the step did not have
            index = tf.constant([[i] for i, p in enumerate(present) if p], tf.int32)
            norms = tf.tensor_scatter_nd_update(full, index, norms)
            maxes_ = tf.tensor_scatter_nd_update(full, index, maxes_)
    flags = tf.cast(tf.stack(flags), tf.float32) if flags else tf.zeros([0])  # 1.0: all finite
    return tf.concat([norms, maxes_, flags], 0)


# -- on the host ---------------------------------------------------------------------------------------
class KerasHealth:
    """The Keras hook's part of health monitoring (``hook.health`` is the core's HealthMonitor)."""

    def __init__(self, hook):
        self.hook = hook
        self.monitor = hook.health
        self.scale = ((), None)  # (the layout's names, the loss scale's column in them)
        self.loss_name = LOSS  # the loss's column (a SessionHook: the graph's loss tensor)
        self.owners: dict[str, str] = {}  # tensor -> the module it belongs to, when no model says it
        self.overflow: dict | None = None  # where the current run of loss-scale overflows began
        self.told = False

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
        ring = monitor.track(
            names, self.loss_name, lambda rows, columns: np.full((rows, columns), ABSENT, np.float32)
        )
        slot = monitor.row()
        ring[slot] = host[: 2 * n]
        triggers = len(monitor.triggers)
        hook = self.hook
        flagged = bool(flags) and (host[2 * n :] != 1.0).any()  # (in PREDICT no loss or gradient shows it)
        skipped, since = (False, None) if flagged else self._overflow(ring[slot], names, host[2 * n :], flags)
        first = monitor.check(slot, ring[slot], skipped)  # (True once: the row's first non-finite statistic)
        if (first or flagged) and monitor.first_nonfinite is None:
            found = since or {
                "step": hook.step,
                "mode": hook.mode.name,
                "mode_step": hook.mode_step,
                **self._where(ring[slot], host[2 * n :], flags),
            }
            monitor.found(found)
        if len(monitor.triggers) > triggers:  # the first non-finite value, or a loss spike
            with hook.guard("save the step's tensors"):
                logs = logs if isinstance(logs, dict) else {}  # (predict returns the predictions)
                self._save_step({**logs, **(kept or {})})

    def _overflow(self, row, names: tuple, flag_values, flags) -> tuple[bool, dict | None]:
        """Whether a step's non-finite values are a LossScaleOptimizer's overflow, which skips the update
        by design (non-finite gradients only, at a loss scale above 1), and, for non-finite gradients
        at a scale of 1 or below (the scale is not to blame), where its run of skipped updates began."""
        bad = self.monitor.nonfinite_names(row)
        column = self._scale_column(names)
        if column is None or not bad:
            if column is not None and self.hook.mode.name == "TRAIN":
                self.overflow = None  # an update that was not skipped
            return False, None
        if not all(name.startswith("gradients/") for name in bad):
            return False, None
        if not row[column] > 1.0:
            return False, self.overflow
        hook = self.hook
        if self.overflow is None:
            self.overflow = {
                "step": hook.step,
                "mode": hook.mode.name,
                "mode_step": hook.mode_step,
                **self._where(row, flag_values, flags),
            }
        if not self.told:
            self.told = True
            logger.info(
                "smdebug: step %d: the LossScaleOptimizer skips its update (the gradients overflowed at "
                "loss scale %g); such steps are not reported as non-finite values",
                hook.step,
                row[column],
            )
        return True, None

    def _scale_column(self, names: tuple) -> int | None:
        """The column of the model's (a custom loop's: the wrapped) LossScaleOptimizer's loss scale."""
        if self.scale[0] is not names:
            from smdebug_tf import capture

            state = self.hook.tf_state
            scale = capture.loss_scale(getattr(state.model, "optimizer", None) or state.optimizer)
            name = capture.variable_name(scale) if scale is not None else None
            self.scale = (names, names.index(name) if name in names else None)
        return self.scale[1]

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
        bad = self.monitor.nonfinite_names(row)
        for value, (direction, module, tensor) in zip(flag_values, flags):
            if value != 1.0:
                where = _where(direction, module, tensor)
                if direction == "forward":  # the layer's own weights, bad as the step began (an update)?
                    weights = [n for n in bad if n != self.loss_name and not n.startswith("gradients/")]
                    params = [n for n in weights if self._owner(n) == module]
                    if params:
                        where["parameters"] = params
                return where
        model = self.hook.tf_state.model
        loss = self.loss_name
        if loss in bad:
            return _where("loss", getattr(model, "name", None) or self.owners.get(loss, loss), loss)
        grads = [name for name in bad if name.startswith("gradients/")]
        name = grads[-1] if grads else (bad[0] if bad else "")
        return _where("backward", self._owner(name), name)

    def _owner(self, tensor: str) -> str:
        """The layer holding the variable of a weight or gradient name."""
        from smdebug_tf import capture

        if tensor in self.owners:
            return self.owners[tensor]
        model = self.hook.tf_state.model
        if model is not None:
            for layer in reversed(capture.walk_layers(model)):  # the innermost layer owning it
                for variable in layer.weights:
                    path = capture.variable_name(variable)
                    if tensor in (path, capture.gradient_name(variable)):
                        return layer.name
        # a custom loop's model is unknown: the layer is the one its variable's path names
        path = tensor.removeprefix("gradients/").removesuffix("Grad").split("/")
        return path[-2] if len(path) > 1 else tensor


def _where(direction: str, module: str, tensor: str) -> dict:
    return {"direction": direction, "module": module, "tensor": tensor}
