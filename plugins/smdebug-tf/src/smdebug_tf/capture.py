"""Capture of tensors that only exist inside Keras' compiled step (gradients, layer tensors, model outputs).

Keras 3 runs each batch through ``model.train_function`` (``test_function``, ``predict_function``), a
``tf.function`` that may be XLA-compiled, and looks the attribute up again on every batch. On a step where
something of that kind is due, the hook swaps in, for that one call, a second function built here with the
same ``jit_compile``: it traces the model's own ``train_step`` while a :class:`Recorder` is active, so the
wrapped optimizer ``apply`` and the wrapped ``layer.call`` add their tensors to the trace, and the function
returns them beside Keras' logs. Steps with nothing due run Keras' function untouched: they cost nothing.

The dataset is read outside the compiled part (as Keras does), and nothing calls back into Python at run
time, so it works under XLA, where ``tf.py_function`` cannot.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import tensorflow as tf

from smdebug_tf.packing import pack

WEIGHTS = "weights"  # the model's variables as the step starts
GRADIENTS = "gradients"
LAYERS = "layers"
OUTPUTS = "outputs"  # model outputs and labels
INPUTS = "inputs"
HEALTH = "health"  # every step's statistics (smdebug_tf.health)

MODEL_INPUT = "model_input"
PREDICTIONS = "predictions"
LABELS = "labels"

_local = threading.local()  # MirroredStrategy traces each replica in a thread of its own
_wrapped_optimizers: weakref.WeakSet = weakref.WeakSet()


def gradient_name(variable) -> str:
    """smdebug 1.0's TF name of a gradient ("gradients/<variable>Grad"), on the Keras 3 variable path."""
    return f"gradients/{variable_name(variable)}Grad"


def variable_name(variable) -> str:
    """A Keras 3 variable's path (``sequential/dense/kernel``); a tf.Variable's name without ``:0``."""
    path = getattr(variable, "path", None)
    if isinstance(path, str) and path:
        return path
    return str(getattr(variable, "name", "variable")).split(":")[0]


def layer_tensor_name(layer, kind: str) -> str:
    """smdebug 1.0's TF 2 name of a layer's tensors: ``<layer name>/inputs`` or ``<layer name>/outputs``."""
    return f"{layer.name}/{kind}"


class Recorder:
    """The tensors one trace of an instrumented step records, by name."""

    def __init__(self, kinds: frozenset[str]):
        self.kinds = kinds
        self.tensors: dict[str, tf.Tensor] = {}
        self.health_grads: dict[str, tf.Tensor] = {}  # HEALTH: gradient name -> gradient
        self.health_flags: list = []  # HEALTH: ((direction, module, tensor), finite flag) in step order
        self.health_loss = None  # HEALTH: the batch's loss (Keras' logs hold the epoch's running mean)
        self.health_scale = None  # HEALTH: a LossScaleOptimizer's loss scale the step's gradients had
        self.graph = tf.compat.v1.get_default_graph()  # the step's graph (traced: its FuncGraph)

    def here(self) -> bool:
        """Whether code runs in the step's own graph: not in a graph Keras builds a layer in (the first
        call of an unbuilt layer), nor in a branch of a tf.cond, whose tensors the step cannot return."""
        return tf.compat.v1.get_default_graph() is self.graph

    def add(self, name: str, value) -> None:
        """Record a (nested) value: one tensor under ``name``, several as ``name_0``, ``name_1``..."""
        self.tensors.update(named_tensors(name, value))


def named_tensors(name: str, value) -> list[tuple[str, tf.Tensor]]:
    """The tensors of a (nested) value with the names they are saved under: ``name`` for one tensor,
    ``name_0``, ``name_1``... for several."""
    leaves = [
        tf.convert_to_tensor(t) for t in tf.nest.flatten(value) if isinstance(t, (tf.Tensor, tf.Variable))
    ]
    return [(name, leaves[0])] if len(leaves) == 1 else [(f"{name}_{i}", t) for i, t in enumerate(leaves)]


def active() -> Recorder | None:
    return getattr(_local, "recorder", None)


@contextlib.contextmanager
def recording(recorder: Recorder):
    previous = active()
    _local.recorder = recorder
    try:
        yield recorder
    finally:
        _local.recorder = previous


# -- the optimizer: gradients as ``apply`` receives them ------------------------------------------
def wrap_optimizer(optimizer, on_eager_gradients=None, on_eager_applied=None, on_applying=None):
    """Wrap ``optimizer.apply`` on this instance (not its class): while a Recorder is active the
    gradients are recorded, unscaled when the optimizer scales the loss, and the variables as they are
    before the update (the weights of a model built inside the step, which the step could not read at
    its start); in eager code the gradients are handed to ``on_eager_gradients(pairs)``, and
    ``on_eager_applied(optimizer, traced=False)`` is called after the update (while a function is traced
    outside a Recorder, ``traced=True``: a custom loop's step in a tf.function); outside a Recorder, eager or
    traced, ``on_applying(pairs, optimizer)`` gets the (variable, gradient) pairs before the update.
    Returns the same optimizer; wrapping twice wraps once."""
    if optimizer in _wrapped_optimizers:
        if on_eager_gradients is not None:
            optimizer.smdebug_on_eager_gradients = on_eager_gradients
        if on_eager_applied is not None:
            optimizer.smdebug_on_eager_applied = on_eager_applied
        if on_applying is not None:
            optimizer.smdebug_on_applying = on_applying
        return optimizer
    original = optimizer.apply
    optimizer.smdebug_on_eager_gradients = on_eager_gradients
    optimizer.smdebug_on_eager_applied = on_eager_applied
    optimizer.smdebug_on_applying = on_applying

    def apply(grads, trainable_variables=None):
        recorder = active()
        eager = recorder is None and tf.executing_eagerly()
        if recorder is not None:
            if WEIGHTS in recorder.kinds and trainable_variables is not None:
                for variable in trainable_variables:  # the ones read at the step's start are kept
                    name = variable_name(variable)
                    if name not in recorder.tensors:
                        recorder.tensors[name] = tf.identity(tf.convert_to_tensor(variable))
            if HEALTH in recorder.kinds and loss_scale(optimizer) is not None:  # before apply changes it
                recorder.health_scale = tf.identity(tf.convert_to_tensor(loss_scale(optimizer)))
            if GRADIENTS in recorder.kinds or HEALTH in recorder.kinds:
                for variable, grad in _unscaled_pairs(optimizer, grads, trainable_variables):
                    if GRADIENTS in recorder.kinds:
                        recorder.add(gradient_name(variable), grad)
                    if HEALTH in recorder.kinds:
                        recorder.health_grads[gradient_name(variable)] = grad
        elif eager and optimizer.smdebug_on_eager_gradients is not None:
            optimizer.smdebug_on_eager_gradients(_unscaled_pairs(optimizer, grads, trainable_variables))
        if recorder is None and optimizer.smdebug_on_applying is not None:
            optimizer.smdebug_on_applying(_unscaled_pairs(optimizer, grads, trainable_variables), optimizer)
        result = original(grads, trainable_variables)
        applied = optimizer.smdebug_on_eager_applied
        if applied is not None and recorder is None and (eager or tf.inside_function()):
            applied(optimizer, traced=not eager)
        return result

    optimizer.apply = apply
    _wrapped_optimizers.add(optimizer)
    return optimizer


def loss_scale(optimizer):
    """A keras.optimizers.LossScaleOptimizer's dynamic loss scale (a variable), else None."""
    return getattr(optimizer, "dynamic_scale", None)


def _unscaled_pairs(optimizer, grads, trainable_variables):
    """(variable, gradient) pairs as the update uses them: a LossScaleOptimizer's dynamic scale and an
    optimizer's ``loss_scale_factor`` divided out, IndexedSlices made dense."""
    variables = trainable_variables if trainable_variables is not None else optimizer.trainable_variables
    scale = None
    dynamic = loss_scale(optimizer)
    if dynamic is not None:
        scale = tf.convert_to_tensor(dynamic)
    factor = getattr(optimizer, "loss_scale_factor", None)
    pairs = []
    for variable, grad in zip(variables, grads):
        if grad is None:
            continue
        grad = tf.convert_to_tensor(grad)  # IndexedSlices -> dense
        if scale is not None:
            grad = grad / tf.cast(scale, grad.dtype)
        if factor is not None:
            grad = grad / tf.cast(factor, grad.dtype)
        pairs.append((variable, grad))
    return pairs


# -- layers: their inputs and outputs, as ``call`` sees them ---------------------------------------
def walk_layers(model) -> list:
    """The model's layers, nested models' layers included (each once)."""
    seen: dict[int, object] = {}

    def visit(layer):
        for sub in getattr(layer, "layers", None) or ():
            if id(sub) not in seen:
                seen[id(sub)] = sub
                visit(sub)

    visit(model)
    return list(seen.values())


@contextlib.contextmanager
def layers_wrapped(model, kinds: frozenset[str]):
    """While tracing an instrumented step: each layer's ``call`` (and the model's, for its outputs)
    records into the active Recorder. Only instance attributes are set, and removed afterwards."""
    targets = []
    if LAYERS in kinds or HEALTH in kinds:
        targets.extend((layer, False) for layer in walk_layers(model))
    if OUTPUTS in kinds:
        targets.append((model, True))
    undo = []
    try:
        for layer, is_model in targets:
            had_own = "call" in vars(layer)
            original = layer.call
            layer.call = _recording_call(layer, original, is_model)
            undo.append((layer, had_own, original))
        yield
    finally:
        for layer, had_own, original in reversed(undo):
            if had_own:
                layer.call = original
            else:
                object.__delattr__(layer, "call")


def _recording_call(layer, original, is_model: bool):
    def call(*args, **kwargs):
        outputs = original(*args, **kwargs)
        recorder = active()
        if recorder is not None and recorder.here():
            if HEALTH in recorder.kinds and not is_model:
                from smdebug_tf.health import finite_flags

                for name, flag in finite_flags(named_tensors(layer_tensor_name(layer, "outputs"), outputs)):
                    recorder.health_flags.append((("forward", layer.name, name), flag))
            if is_model:
                recorder.add(PREDICTIONS, outputs)
            elif LAYERS in recorder.kinds:
                inputs = args[0] if args else next(iter(kwargs.values()), None)
                if inputs is not None:
                    recorder.add(layer_tensor_name(layer, "inputs"), inputs)
                recorder.add(layer_tensor_name(layer, "outputs"), outputs)
        return outputs

    return call


@contextlib.contextmanager
def loss_wrapped(model, kinds: frozenset[str]):
    """While tracing a HEALTH step: the batch's loss, as ``model.compute_loss`` computes it (Keras'
    train_step calls it, and so do custom train_steps), is recorded."""
    original = getattr(model, "compute_loss", None)
    if HEALTH not in kinds or original is None:
        yield
        return
    had_own = "compute_loss" in vars(model)

    def compute_loss(*args, **kwargs):
        loss = original(*args, **kwargs)
        recorder = active()
        if (
            recorder is not None
            and recorder.health_loss is None
            and isinstance(loss, tf.Tensor)
            and recorder.here()
        ):
            recorder.health_loss = _unscaled(loss)
        return loss

    object.__setattr__(model, "compute_loss", compute_loss)
    try:
        yield
    finally:
        if had_own:
            object.__setattr__(model, "compute_loss", original)
        else:
            object.__delattr__(model, "compute_loss")


def _unscaled(loss):
    """A replica's loss as Keras' logs count it: compute_loss divides it by the number of replicas of a
    distribution strategy (their gradients are summed)."""
    try:
        from keras.src.losses.loss import unscale_loss_for_distribution
    except ImportError:  # a Keras without it scales nothing
        return loss
    return unscale_loss_for_distribution(loss)


def _health(model, recorder: Recorder, weights: list, layout: list) -> tf.Tensor:
    """The step's health vector (smdebug_tf.health.statistics); its names go to ``layout``. A loss
    scaler's scale is the last column (every mode: the recorder's columns stay the same)."""
    from smdebug_tf.health import LOSS, statistics

    grads = [gradient_name(v) for v in model.trainable_variables]
    names = [n for n, _ in weights] + grads + [LOSS]
    tensors = [t for _, t in weights] + [recorder.health_grads.get(g) for g in grads] + [recorder.health_loss]
    scale = loss_scale(getattr(model, "optimizer", None))
    if scale is not None:
        names.append(variable_name(scale))
        tensors.append(recorder.health_scale)
    layout[:] = [(tuple(names), tuple(where for where, _ in recorder.health_flags))]
    return statistics(tensors, [flag for _, flag in recorder.health_flags])


# -- the instrumented step functions --------------------------------------------------------------
def _reduce(values, strategy, reduction: str):
    """Keras' own reduction of per-replica logs (identity without a distribution strategy)."""
    try:
        from keras.src.backend.tensorflow.trainer import reduce_per_replica
    except ImportError:  # a Keras without it: only a single replica's values are plain tensors
        return values
    return reduce_per_replica(values, strategy, reduction)


def build(model, mode: str, kinds: frozenset[str], plan_of, on_built=None, keep_of=None):
    """A function taking what Keras' own ``<mode>_function`` takes, returning ``(its result, packed)``:
    the due tensors in a few buffers (smdebug_tf.packing; ``plan_of(name)`` says what is due of each, and
    is asked once per name: every trace of the function packs the same). mode is "train", "test" or
    "predict". ``function.plans`` holds the plans it was traced with. The function returns
    ``(result, packed, health, kept)``: with HEALTH the step's health vectors (one per replica), whose
    layout is ``function.health_layout[0]`` once traced (else empty vectors), and ``kept``, the tensors
    ``keep_of(name)`` names, each replica's, as they are (references to the step's tensors, not copied:
    the host reads them only when the step triggers the flight recorder). ``on_built()`` is called once the step has
    run while tracing (a model built by its first call has its variables then)."""
    strategy = model.distribute_strategy
    step_fn = {"train": model.train_step, "test": model.test_step, "predict": model.predict_step}[mode]
    reduction = "concat" if mode == "predict" else "auto"
    plans: dict[str, tuple | None] = {}
    lock = threading.Lock()  # MirroredStrategy traces its replicas on threads of their own
    health_layout: list = []

    def planned(name: str):
        with lock:
            if name not in plans:
                plans[name] = plan_of(name)
            return plans[name]

    @tf.autograph.experimental.do_not_convert
    def replica_step(data):
        with recording(Recorder(kinds)) as recorder:
            weights = []
            if HEALTH in kinds:  # read before the step's update, as below
                from smdebug_tf.health import finite_flags

                weights = [(variable_name(v), tf.convert_to_tensor(v)) for v in model.weights]
                y = None
                if mode != "predict":
                    import keras

                    x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
                else:
                    x = data[0] if isinstance(data, tuple) else data
                for name, value in ((MODEL_INPUT, x), (LABELS, y)):  # (named as the saved ones)
                    for tensor, flag in finite_flags(named_tensors(name, value)):
                        recorder.health_flags.append((("input", model.name, tensor), flag))
            if WEIGHTS in kinds:  # read before the step's update (TF orders the ops on each variable)
                for variable in model.weights:
                    recorder.tensors[variable_name(variable)] = tf.identity(tf.convert_to_tensor(variable))
            if mode != "predict" and (INPUTS in kinds or OUTPUTS in kinds):
                import keras

                x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
                if INPUTS in kinds:
                    recorder.add(MODEL_INPUT, x)
                if OUTPUTS in kinds and y is not None:
                    recorder.add(LABELS, y)
            elif mode == "predict" and INPUTS in kinds:
                recorder.add(MODEL_INPUT, data[0] if isinstance(data, tuple) else data)
            result = step_fn(data)
        if on_built is not None:
            on_built()
        health = _health(model, recorder, weights, health_layout) if HEALTH in kinds else tf.zeros([0])
        kept = {n: t for n, t in recorder.tensors.items() if keep_of is not None and keep_of(n)}
        return result, pack(recorder.tensors, planned), health, kept

    @tf.autograph.experimental.do_not_convert
    def one_step(data):
        # runs while the step is traced (each call only when run eagerly): the layers record then
        with layers_wrapped(model, kinds), loss_wrapped(model, kinds):
            result, packed, health, kept = strategy.run(replica_step, args=(data,))
        result = _reduce(result, strategy, reduction)
        packed = tf.nest.map_structure(lambda t: tuple(strategy.experimental_local_results(t)), packed)
        health = tuple(strategy.experimental_local_results(health))  # each replica's
        kept = {n: tuple(strategy.experimental_local_results(t)) for n, t in kept.items()}  # (the same)
        return result, packed, health, kept

    run_eagerly = model.run_eagerly
    if not run_eagerly:
        one_step = tf.function(one_step, jit_compile=bool(model.jit_compile), reduce_retracing=True)

    if mode == "predict":

        @tf.autograph.experimental.do_not_convert
        def predict(data):  # Keras hands predict_function a list of batches, one per execution step
            return one_step(data[0])

        compiled = predict if run_eagerly else tf.function(predict, reduce_retracing=True)

        def predict_function(data):
            return compiled(data)

        predict_function.plans = plans
        predict_function.health_layout = health_layout
        return predict_function

    @tf.autograph.experimental.do_not_convert
    def from_iterator(iterator):  # the batch is read here, outside the (maybe XLA) compiled step
        return one_step(iterator.get_next())

    if not run_eagerly:
        from_iterator = tf.function(from_iterator, reduce_retracing=True)

    def function(iterator):
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return from_iterator(iterator)
        return one_step(next(iterator))  # a Python iterator (train_on_batch and friends)

    function.plans = plans
    function.health_layout = health_layout
    return function
