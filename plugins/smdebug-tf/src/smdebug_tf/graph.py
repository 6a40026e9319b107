"""TF 1.x graphs (``tf.compat.v1``): what a SessionHook fetches, and when fetching it is safe.

A graph is finalized once a MonitoredSession starts, so every op the hook may fetch is added before, while
the script builds the graph (a wrapped optimizer's ``apply_gradients``) or in ``SessionRunHook.begin``.
A wrapped ``apply_gradients`` records its gradients, reads each variable before the update (the update
waits for the read, so a step's weights are the values its gradients were computed with) and, after
the update, the optimizer's variables; those reads run on every step but cost nothing unless fetched.
"""

from __future__ import annotations

import threading
import weakref
from typing import NamedTuple

import tensorflow as tf

SCOPE = "smdebug"  # name scope of the ops the hook adds to a graph
# stateful ops that only read: running one more of them for the hook changes nothing
_READS = frozenset(
    {"ReadVariableOp", "VarHandleOp", "VariableV2", "Variable", "VarIsInitializedOp", "IsVariableInitialized"}
)
_PLACEHOLDERS = frozenset({"Placeholder", "PlaceholderV2"})
_SWITCHES = frozenset({"Switch", "RefSwitch"})  # TF 1.x control flow: one of the two outputs is dead
_MERGES = frozenset({"Merge", "RefMerge"})  # has a value when any input has one
_EXITS = frozenset({"Exit", "RefExit"})


class Applied(NamedTuple):
    """One call of a wrapped ``apply_gradients``: (gradient, variable) pairs and the gradients' names, the
    variables' values read before the update, the optimizer's variables read after it."""

    gradients: list
    weights: dict  # variable -> its read before the update
    optimizer_variables: list  # (variable, its read after the update)
    names: list  # of the gradients: a sparse one's (made dense) is its IndexedSlices' name


_applied: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> [Applied]
_local = threading.local()


def applied(graph) -> list[Applied]:
    return _applied.get(graph, [])


def in_graph_mode() -> bool:
    """Whether TF builds graphs outside functions (``tf.compat.v1.disable_eager_execution()``)."""
    return not tf.compat.v1.executing_eagerly_outside_functions()


def graph_tensors(arg) -> list | None:
    """``[(graph name, tensor or variable)]`` of a tf.Tensor, tf.Variable or tf.Operation of a TF 1.x
    graph; None for anything else (eager values, Keras variables)."""
    if not in_graph_mode():
        return None
    if isinstance(arg, tf.Operation):
        return [(t.name, t) for t in arg.outputs]
    if isinstance(arg, (tf.Tensor, tf.Variable)):
        return [(arg.name, arg)]
    return None


def read(variable) -> tf.Tensor:
    """The variable's value at this point of the run call. A reference variable's (TF 1.x's, as
    ``tf.compat.v1.disable_v2_behavior()`` makes them) read shares its buffer, which the optimizer then
    updates in place: it is copied (a resource variable's read is a value already)."""
    value = variable.read_value()
    if variable.dtype.base_dtype != variable.dtype:  # a reference dtype (float32_ref)
        return tf.raw_ops.Snapshot(input=value)
    return value


def read_of(op) -> str | None:
    """The name of the reference variable (TF 1.x's) whose own read ``op`` is (``dense/kernel/read``:
    ``dense/kernel:0``), else None."""
    if op.type != "Identity" or len(op.inputs) != 1:
        return None
    source = op.inputs[0]
    if source.op.type in ("VariableV2", "Variable") and op.name == source.op.name + "/read":
        return source.name
    return None


def record_apply(optimizer, apply, grads_and_vars, global_step=None, name=None):
    """``apply(grads_and_vars, global_step, name)``, the optimizer's own ``apply_gradients``, with its
    gradients and variables recorded for the graph's SessionHook."""
    if tf.executing_eagerly() or getattr(_local, "busy", False):  # a subclass calling its base's
        return apply(grads_and_vars, global_step, name)
    pairs = list(grads_and_vars)
    graph = tf.compat.v1.get_default_graph()
    reads: dict = {}
    grads: list = []
    names: list = []
    try:
        with tf.compat.v1.name_scope(f"{SCOPE}/weights"):
            for grad, variable in pairs:
                if grad is None:
                    continue
                if variable.ref() not in reads:
                    reads[variable.ref()] = (variable, read(variable))
                # a sparse gradient (tf.nn.embedding_lookup's) is saved dense, by the name TensorFlow gives
                # it (its values'), not by its conversion's (an op of the hook's scope)
                names.append(grad.name)
                grads.append(
                    (tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad, variable)
                )
    except Exception:  # an optimizer of a kind not foreseen: train as if the hook were not there
        reads, grads, names = {}, [], []
    _local.busy = True
    try:
        with tf.control_dependencies([r for _, r in reads.values()]):
            op = apply(pairs, global_step, name)
    finally:
        _local.busy = False
    try:
        with tf.control_dependencies([op]), tf.compat.v1.name_scope(f"{SCOPE}/optimizer"):
            after = [(v, v.read_value()) for v in optimizer.variables()]
    except Exception:
        after = []
    weights = {variable.ref(): read for variable, read in reads.values()}
    _applied.setdefault(graph, []).append(Applied(grads, weights, after, names))
    return op


def wrap_optimizer(optimizer):
    """Wrap this ``tf.compat.v1.train.Optimizer`` instance's ``apply_gradients`` (once)."""
    if "apply_gradients" in vars(optimizer):
        return optimizer
    original = optimizer.apply_gradients

    def apply_gradients(grads_and_vars, global_step=None, name=None):
        return record_apply(optimizer, original, grads_and_vars, global_step, name)

    optimizer.apply_gradients = apply_gradients
    return optimizer


def wrap_optimizer_class(cls) -> None:
    """Zero code change: every ``tf.compat.v1.train.Optimizer`` (``cls``) records its ``apply_gradients``."""
    original = cls.apply_gradients
    if getattr(original, "smdebug_records", False):
        return

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        def own(pairs, step, op_name):
            return original(self, pairs, step, op_name)

        return record_apply(self, own, grads_and_vars, global_step, name)

    apply_gradients.smdebug_records = True
    cls.apply_gradients = apply_gradients


def changes_state(op) -> bool:
    """Stateful, or writing to a reference variable it takes as input (TF 1.x's ``Assign``, ``ApplyAdam``:
    TensorFlow does not mark these stateful; fetching an initializer's ``Assign`` would reset a weight)."""
    return op.op_def.is_stateful or any(arg.is_ref for arg in op.op_def.input_arg)


def unfetchable(graph) -> set:
    """The ops of a TF 1.x graph whose outputs a run call may not have, which fetching would make it fail:
    those inside a ``tf.cond`` or ``tf.while_loop`` (a branch not taken has no value; a loop's ops run
    in a frame of their own, once per iteration), those after a ``Switch`` and before a ``Merge`` (a
    cond's gradients), those TensorFlow marks unfetchable. A top-level loop's ``Exit`` (its result) is
    fine. (TF 2 control flow, functional ``If``/``While`` ops, hides its ops in functions.)"""
    dead: set = set()  # may have no value in a run call, and so may what uses them
    for op in graph.get_operations():  # in creation order: an op's inputs come first (but a loop's)
        context = getattr(op, "_control_flow_context", None)
        if op.type in _EXITS and context is not None and context.outer_context is None:
            continue
        if (
            context is not None
            or op.type in _SWITCHES
            or (
                op.type not in _MERGES
                and any(p in dead for p in [t.op for t in op.inputs] + list(op.control_inputs))
            )
        ):
            dead.add(op)
    return dead | {op for op in graph.get_operations() if not graph.is_fetchable(op)}


class Reach:
    """Which tensors one ``Session.run`` call can also fetch without changing what it does: none that
    needs a placeholder the call does not feed (the run would fail), nor a stateful op the call would not
    run otherwise (reading a batch from an iterator, applying an update); reads of variables are fine."""

    def __init__(self, graph):
        self.graph = graph
        self.calls: dict = {}  # (fetched ops, fed tensors) -> (the ops the call runs, {tensor: allowed})

    def allowed(self, tensor, fetches, feeds) -> bool:
        key = (self.ops_of(fetches), self.names_of(feeds))
        found = self.calls.get(key)
        if found is None:
            found = self.calls[key] = (self.ancestors(key[0], key[1]), {})
        runs, answers = found
        answer = answers.get(tensor.name)
        if answer is None:
            answer = answers[tensor.name] = self.safe(tensor, runs, key[1])
        return answer

    def element(self, item):
        try:
            return self.graph.as_graph_element(item, allow_tensor=True, allow_operation=True)
        except Exception:  # something the hook cannot name: it does not widen what the call runs
            return None

    def ops_of(self, fetches) -> frozenset:
        ops = set()
        for leaf in tf.nest.flatten(fetches):
            found = self.element(leaf)
            if isinstance(found, tf.Tensor):
                ops.add(found.op)
            elif isinstance(found, tf.Operation):
                ops.add(found)
        return frozenset(ops)

    def names_of(self, feeds) -> frozenset:
        names = set()
        for key in feeds or ():
            found = self.element(key)
            if isinstance(found, tf.Tensor):
                names.add(found.name)
        return frozenset(names)

    @staticmethod
    def ancestors(ops, fed) -> set:
        seen = set(ops)
        todo = list(ops)
        while todo:
            op = todo.pop()
            for parent in [t.op for t in op.inputs if t.name not in fed] + list(op.control_inputs):
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return seen

    @staticmethod
    def safe(tensor, runs, fed) -> bool:
        if tensor.name in fed:
            return True
        seen = {tensor.op}
        todo = [tensor.op]
        while todo:
            op = todo.pop()
            if op in runs:
                continue
            if op.type in _PLACEHOLDERS or (changes_state(op) and op.type not in _READS):
                return False
            for parent in [t.op for t in op.inputs if t.name not in fed] + list(op.control_inputs):
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return True
