"""``hook.wrap_tape(tape)``: a proxy around one GradientTape for custom training loops.

Entering the tape starts a step; ``tape.gradient`` hands the loss, the gradients and the variables to the
hook. In eager code the hook saves them directly. Inside a ``tf.function`` the Python code runs only while
tracing, so the proxy adds two small host calls to the graph: one at the tape's start that begins the step
and says whether anything is due, and one, run only when something is due, that receives the values. An
XLA-compiled function cannot call the host at all: there the tape works untouched and the hook says once
that it saves nothing from inside it. Only this tape is wrapped, never the GradientTape class (which would
also catch Keras' own tapes).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def host_call(hook, function):
    """``function`` for a tf.py_function of a traced step: TensorFlow runs independent ops at once on
    its threads (the tape's values and the optimizer's variables, say), and the hook takes them one at
    a time."""

    def call(*args):
        with hook.tf_state.host_lock:
            return function(*args)

    return call


def in_xla_context() -> bool:
    """Whether the code being traced is compiled by XLA (where no host call can run)."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # cannot tell: treat as XLA, the safe side (nothing is added to the graph)
        return True
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _another_replica() -> bool:
    """Whether this runs as a replica of a distribution strategy's step other than the first."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync < 2:
        return False
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    return replica is not None and int(replica) != 0


class WrappedTape:
    """Behaves as the GradientTape it wraps (every other attribute is the tape's)."""

    def __init__(self, hook, tape: tf.GradientTape):
        self.tape = tape
        self.hook = hook
        self.due = None  # in a traced function: the symbolic "anything due at this step"
        self.inert = False

    def __enter__(self):
        self.tape.__enter__()
        with self.hook.guard("start a GradientTape step"):
            if _another_replica():  # strategy.run runs the step once per replica: one step, the first's
                self.inert = True
                if self.hook.include_workers == "all":
                    self.hook.warn_once(
                        "tape-replicas",
                        "smdebug: wrap_tape under a distribution strategy saves the first replica's tensors "
                        "as this process's worker (a worker per replica is for model.fit with the KerasHook)",
                    )
            elif not tf.inside_function():
                self.hook.tape_step_begin()
            elif in_xla_context():
                self.inert = True
                self.hook.warn_once(
                    "tape-xla",
                    "smdebug: wrap_tape inside an XLA-compiled function (jit_compile=True): values cannot "
                    "leave a compiled step, nothing is saved (nor watched by health) from this tape. Call "
                    "the tape step without jit_compile, or use model.fit with the KerasHook, which captures "
                    "under XLA.",
                )
            else:
                self.due = tf.py_function(host_call(self.hook, self.host_step_begin), [], Tout=tf.bool)
                self.hook.tf_state.traced_tape = (tf.compat.v1.get_default_graph(), self)
        return self

    def __exit__(self, *exc_info):
        return self.tape.__exit__(*exc_info)

    def host_step_begin(self):
        self.hook.tape_step_begin()
        return np.bool_(self.hook.anything_due())

    def gradient(self, target, sources, output_gradients=None, unconnected_gradients=None, **kwargs):
        if unconnected_gradients is not None:
            kwargs["unconnected_gradients"] = unconnected_gradients
        grads = self.tape.gradient(target, sources, output_gradients, **kwargs)
        with self.hook.guard("save the GradientTape's tensors"):
            self.hand_over(target, sources, grads)
        return grads

    def hand_over(self, target, sources, grads) -> None:
        if self.inert:
            return  # (another replica's tape, or one under XLA)
        pairs = [
            (v, g)
            for v, g in zip(tf.nest.flatten(sources), tf.nest.flatten(grads))
            if g is not None and hasattr(v, "dtype")
        ]
        loss = target if isinstance(target, tf.Tensor) and target.shape.rank == 0 else None
        hook = self.hook
        if hook.health is not None:
            if hook.tf_state.optimizer is not None:  # recorded as it applies them (maybe changed)
                graph = tf.compat.v1.get_default_graph() if tf.inside_function() else None
                hook.tf_state.tape_health = (graph, loss)
            else:
                record_health(hook, pairs, loss)
        if not tf.inside_function():
            self.hook.tape_tensors(pairs, loss)
            return
        if self.due is None:
            return
        variables = [v for v, _ in pairs]
        values = [tf.convert_to_tensor(g) for _, g in pairs]
        values += [tf.convert_to_tensor(v) for v in variables]
        if loss is not None:
            values.append(loss)
        hook, count = self.hook, len(pairs)

        def save(*arrays):
            grads_now = arrays[:count]
            weights_now = arrays[count : 2 * count]
            loss_now = arrays[2 * count] if loss is not None else None
            hook.tape_tensors(list(zip(variables, grads_now)), loss_now, weights=weights_now)
            return np.bool_(True)

        tf.cond(
            self.due,
            lambda: tf.py_function(host_call(hook, save), values, Tout=tf.bool),
            lambda: tf.constant(False),
        )

    def optimizer_applied(self, optimizer) -> None:
        """While the step is traced, after the wrapped optimizer's update: on due steps, a host call
        receiving its variables (read after the update: TF orders a function's ops on a variable)."""
        variables = list(getattr(optimizer, "variables", None) or ())
        if self.inert or self.due is None or not variables:
            return
        from smdebug_tf.capture import variable_name

        names = [variable_name(v) for v in variables]
        hook = self.hook

        def save(*arrays):
            hook.traced_optimizer_variables(names, arrays)
            return np.bool_(True)

        tf.cond(
            self.due,
            lambda: tf.py_function(
                host_call(hook, save), [tf.convert_to_tensor(v) for v in variables], Tout=tf.bool
            ),
            lambda: tf.constant(False),
        )

    def __getattr__(self, name):
        return getattr(self.tape, name)


def record_health(hook, pairs, loss, scale=None) -> None:
    """With health: a custom loop's step statistics of the variables (before the update), their
    gradients and the loss (and a LossScaleOptimizer's loss scale, before the update changes it), one
    vector the host takes every step (in a tf.function: a host call)."""
    from smdebug_tf.capture import gradient_name, variable_name
    from smdebug_tf.health import LOSS, statistics

    names = [variable_name(v) for v, _ in pairs] + [gradient_name(v) for v, _ in pairs]
    tensors = [tf.convert_to_tensor(v) for v, _ in pairs] + [tf.convert_to_tensor(g) for _, g in pairs]
    if loss is not None:
        names.append(LOSS)
        tensors.append(loss)
    if scale is not None:  # the tape's target was the scaled loss
        names.append(variable_name(scale))
        scale = tf.identity(tf.convert_to_tensor(scale))
        tensors.append(scale)
        if loss is not None:
            tensors[names.index(LOSS)] = loss / tf.cast(scale, loss.dtype)
    names = tuple(names)
    vector = statistics(tensors, [])
    if not tf.inside_function():  # a trigger saves the step's tensors the collections name
        hook.tape_health(names, vector, dict(zip(names, tensors)))
        return

    def record(values):
        hook.tape_health(names, values)
        return np.bool_(True)

    tf.py_function(host_call(hook, record), [vector], Tout=tf.bool)
