"""TFHook: everything KerasHook does, in a class that needs no Keras import to be defined.

KerasHook (smdebug_tf.hook) adds keras.callbacks.Callback as a base. Activation may have to build the
hook while Keras is still being imported (``import keras`` imports TensorFlow half-way through), so the
hook is built as a TFHook then and becomes a KerasHook once Keras is ready (smdebug_tf.activation).

What the hook saves, and when (names in the plugin's README):

- from inside the compiled step, only on steps where one of them is due (smdebug_tf.capture): weights
  and biases as the step starts, gradients, layer inputs/outputs, model outputs, labels and inputs;
- what the step function returns: losses and metrics (the logs Keras hands its callbacks), predictions;
- after the step: optimizer variables (updated).
"""

from __future__ import annotations

import logging
import sys
import threading

import numpy as np
import tensorflow as tf

from smdebug.plugin import BaseHook, CollectionKeys, ModeKeys, SMDebugTypeError
from smdebug_tf import capture
from smdebug_tf.collection import BUILTIN_PATTERNS, Collection, exact, numbered
from smdebug_tf.packing import unpack
from smdebug_tf.tensors import snapshot

logger = logging.getLogger("smdebug")

_KEEP_FUNCTIONS = 4  # instrumented functions kept per mode and kinds (one per set of plans)

# mode -> (capture.build's name, the model attribute Keras calls for each batch, the stop flag Keras reads)
_KERAS_MODES = {
    ModeKeys.TRAIN: ("train", "train_function", "stop_training"),
    ModeKeys.EVAL: ("test", "test_function", "stop_evaluating"),
    ModeKeys.PREDICT: ("predict", "predict_function", "stop_predicting"),
}


def _summary(exc: Exception) -> str:
    """An exception's message in one line: for TensorFlow's, the line saying what went wrong (its
    message also holds the graph's node names and stack traces)."""
    skip = ("Graph execution error", "Detected at node", "<stack traces", "Traceback", "File ", "[[")
    lines = [line.strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line and not line.startswith(skip)]
    return (lines[-1] if lines else type(exc).__name__)[:200]


def _put(model, attribute: str, function) -> None:
    """Set a step function on the model without Keras' attribute tracking (which costs more than the rest
    of a due step's preparation, and would record the stand-in as a dependency of the model)."""
    object.__setattr__(model, attribute, function)


class TFState:
    """The hook's TensorFlow-side state (one attribute, so nothing clashes with BaseHook's own)."""

    def __init__(self):
        self.model = None
        self.model_ref = None  # id of the model the names below were taken from
        self.weights: list = []  # (name, variable)
        self.gradient_names: list[str] = []
        self.layer_names: list[str] = []
        self.optimizer = None
        self.optimizer_variables: dict = {}  # id(optimizer) -> [(name, variable)]
        self.known: dict[str, set[str]] = {}  # collection -> exact names already included
        # (mode, kinds) -> [(Keras' function it stands in for, instrumented)], the last used first
        self.functions: dict = {}
        self.plans: dict[str, tuple] = {}  # name -> (its collections, due collections, its capture plan)
        self.swapped = None  # (model, attribute, Keras' function) while an instrumented one is in place
        self.broken: set = set()  # modes whose instrumented function failed once
        self.saved: set[str] = set()  # gradient names saved in a custom loop's step ...
        self.saved_step = -1  # ... this one
        self.devices: list[str] = []  # a distribution strategy's replicas, as smdebug 1.0 names them
        self.replicas: list = []  # include_workers "all": a hook writing each further replica's tensors
        self.batch = 0  # Keras' batch number of the step (the `batch` metric)
        self.logged = (-1, frozenset())  # (step, the log keys saved at it)
        self.epoch_logged = False  # the epoch's training logs are saved (before its validation)
        self.fitting = False  # between on_train_begin and on_train_end
        self.pending: list = []  # (method, arguments) of record_tensor_value calls before the first step
        self.traced_tape = None  # (graph, WrappedTape) of the custom loop's step being traced
        # a traced step's host calls (smdebug_tf.tape), which TensorFlow may run at once on two threads
        self.host_lock = threading.Lock()
        self.health = None  # with health=True: smdebug_tf.health.KerasHealth
        self.tape_health = None  # (graph or None, loss): a wrapped tape's step awaiting its optimizer
        self.kept_kinds = (None, frozenset())  # (key, kinds) the health steps keep for a trigger


class TFHook(BaseHook):
    framework = "tensorflow"
    collection_class = Collection
    builtin_collections = (
        CollectionKeys.ALL,
        CollectionKeys.DEFAULT,
        CollectionKeys.WEIGHTS,
        CollectionKeys.BIASES,
        CollectionKeys.GRADIENTS,
        CollectionKeys.LOSSES,
        CollectionKeys.METRICS,
        CollectionKeys.INPUTS,
        CollectionKeys.OUTPUTS,
        CollectionKeys.LAYERS,
        CollectionKeys.SM_METRICS,
        CollectionKeys.OPTIMIZER_VARIABLES,
    )
    builtin_patterns = BUILTIN_PATTERNS
    default_include_collections = (CollectionKeys.METRICS, CollectionKeys.LOSSES, CollectionKeys.SM_METRICS)

    def setup(self) -> None:
        self.tf_state = TFState()

    # -- names ---------------------------------------------------------------------------------------
    def include_names(self, collection: str, names, pattern=exact) -> None:
        """Make these names members of a collection (once each): exactly, or as ``pattern`` matches."""
        known = self.tf_state.known.setdefault(collection, set())
        new = [n for n in names if n not in known]
        if new:
            coll = self.get_collection(collection)
            for name in new:
                coll.include(pattern(name))
            known.update(new)

    def include_variables(self, variables, name_of=capture.variable_name) -> list:
        """(name, variable) of model variables, each in weights or biases (smdebug: "bias" in its name)."""
        pairs = [(name_of(v), v) for v in variables]
        biases = [n for (n, v) in pairs if "bias" in str(getattr(v, "name", n)).split(":")[0]]
        self.include_names(CollectionKeys.BIASES, biases)
        self.include_names(CollectionKeys.WEIGHTS, [n for n, _ in pairs if n not in set(biases)])
        return pairs

    # -- distributed: one process, several replicas (MirroredStrategy) ---------------------------------
    def worker_name(self) -> str:
        device = getattr(self, "replica_device", None)  # a replica's hook (class attribute)
        if device:
            return device
        state = getattr(self, "tf_state", None)  # None while BaseHook.__init__ runs
        if state is not None and state.devices and self.include_workers == "all":
            return state.devices[0]
        return super().worker_name()

    def num_workers(self) -> int:
        state = getattr(self, "tf_state", None)
        if state is not None and state.devices and self.include_workers == "all":
            return len(state.devices)
        return super().num_workers()

    def register_replicas(self, model) -> None:
        """With include_workers "all" and several replicas, each further replica gets a hook of its own
        (same collections) that writes its tensors as the worker named after its device."""
        state = self.tf_state
        strategy = model.distribute_strategy
        if self.include_workers != "all" or state.devices or strategy.num_replicas_in_sync < 2:
            return
        devices = list(strategy.extended.worker_devices)
        # smdebug 1.0 names a replica's worker after its device, in a form that fits in file names
        state.devices = [d.replace("/", "_").replace(":", "-") for d in devices]
        from smdebug_tf import set_hook

        for device in state.devices[1:]:
            replica_class = type(f"{type(self).__name__}Replica", (TFHook,), {"replica_device": device})
            replica = replica_class.from_config(self.options)
            replica.collection_manager = self.collection_manager
            replica.include_collections = self.include_collections
            replica.tf_state.devices = state.devices  # (its number of workers: the run's)
            state.replicas.append(replica)
        set_hook(self)  # get_hook() stays the user's hook, not a replica's

    def save_replicas(self, replicas: list, health=None, layout=None, kept=None) -> None:
        """Each further replica's (name, value) pairs, and with health its statistics (``health``: each
        replica's vector; ``kept``: each replica's tensors for a trigger), by the hook writing that
        replica's tensors."""
        vectors = list(health or ())[1:]
        for i, hook in enumerate(self.tf_state.replicas):
            values = replicas[i + 1] if i + 1 < len(replicas) else []
            vector = vectors[i] if i < len(vectors) else None
            if not values and vector is None:
                continue
            hook.set_mode(self.mode)
            hook.begin_step(step=self.step, mode_step=self.mode_step)
            with hook.together():
                for name, value in values:
                    hook.save_for_step(name, value)
            if vector is not None:
                hook.health_step(vector, layout, of_replica(kept, i + 1), None)
            hook.end_step()

    def register_model(self, model) -> None:
        """Take the model's variable, gradient and layer names, and wrap its optimizer (fit does this)."""
        state = self.tf_state
        state.model = model
        state.model_ref = id(model)
        state.weights = self.include_variables(model.weights)
        state.gradient_names = [capture.gradient_name(v) for v in model.trainable_variables]
        layers = capture.walk_layers(model)
        state.layer_names = [
            capture.layer_tensor_name(layer, k) for layer in layers for k in ("inputs", "outputs")
        ]
        self.include_names(CollectionKeys.LAYERS, state.layer_names, numbered)  # several tensors: _0, _1
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "apply"):
            self.wrap_optimizer(optimizer)
        with self.guard("give each replica a worker"):
            self.register_replicas(model)

    def refresh_optimizer_variables(self, optimizer) -> list:
        """(name, variable) of an optimizer's variables (again once it has built more of them)."""
        variables = list(getattr(optimizer, "variables", None) or ())
        known = self.tf_state.optimizer_variables
        pairs = known.get(id(optimizer))
        if pairs is None or len(variables) != len(pairs):
            pairs = known[id(optimizer)] = [(capture.variable_name(v), v) for v in variables]
            self.include_names(CollectionKeys.OPTIMIZER_VARIABLES, [n for n, _ in pairs])
        return pairs

    # -- Keras callback protocol ----------------------------------------------------------------------
    # No on_*_batch_end: a callback that has one makes Keras wait for every batch's logs (no async
    # dispatch). On a due step the hook gets the logs, and ends the step, from the one call of the function
    # it puts in place of Keras' own; other steps end when the next one begins.
    def set_model(self, model) -> None:
        with self.guard("register the Keras model"):
            self.register_model(model)

    def on_train_begin(self, logs=None):
        if self.tf_state.fitting:  # the last fit never reached on_train_end
            self.training_raised()
        self.tf_state.fitting = True
        self.mode_begin(ModeKeys.TRAIN)

    def on_test_begin(self, logs=None):
        state = self.tf_state
        if state.fitting and self.mode == ModeKeys.TRAIN and state.model is not None and not self.closed:
            # fit's validation starts: the training step that ends here is the epoch's last one, and the
            # model's metrics are still the epoch's (smdebug 1.0 saves them at the end of each epoch)
            with self.guard("save the epoch's training logs"):
                self.save_epoch_logs(state.model.get_metrics_result())
                state.epoch_logged = True
        self.mode_begin(ModeKeys.EVAL)

    def on_predict_begin(self, logs=None):
        self.mode_begin(ModeKeys.PREDICT)

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_begin(ModeKeys.TRAIN, batch)

    def on_test_batch_begin(self, batch, logs=None):
        self.batch_begin(ModeKeys.EVAL, batch)

    def on_predict_batch_begin(self, batch, logs=None):
        self.batch_begin(ModeKeys.PREDICT, batch)

    def on_train_end(self, logs=None):
        self.tf_state.fitting = False
        self.mode_end()

    def on_test_end(self, logs=None):
        self.mode_end()

    def on_predict_end(self, logs=None):
        self.mode_end()

    def on_epoch_end(self, epoch, logs=None):
        # smdebug 1.0 saves the epoch's logs whatever the save configuration: the training ones with the
        # epoch's last training step (before validation, if any: on_test_begin), the validation results,
        # which exist only here, with the epoch's last validation step
        logged, self.tf_state.epoch_logged = self.tf_state.epoch_logged, False
        if self.closed or not logs:
            return
        with self.guard("save the epoch's logs"):
            if not logged and self.mode == ModeKeys.TRAIN:
                self.save_epoch_logs({k: v for k, v in logs.items() if not k.startswith("val_")})
            self.save_epoch_logs({k: v for k, v in logs.items() if k.startswith("val_")}, batch=False)

    def save_epoch_logs(self, logs, batch: bool = True) -> None:
        """Save these logs at the current step, but those the step saved already."""
        state = self.tf_state
        done = state.logged[1] if state.logged[0] == self.step else frozenset()
        logs = self.flat_logs(logs)
        if batch:
            logs = {**logs, "batch": state.batch}
        for key, value in logs.items():
            if key not in done:
                if isinstance(value, float):  # Keras' epoch logs: 0-d float32, as the steps' logs are
                    value = np.asarray(value, np.float32)
                collection = CollectionKeys.LOSSES if self.is_loss(key) else CollectionKeys.METRICS
                if self.saving_ended(collection):
                    continue
                self.include_names(collection, [key])
                self.save_tensor(key, value, collection)
        state.logged = (self.step, done | set(logs))

    def saving_ended(self, collection: str) -> bool:
        """The collection's save configuration for this mode saves no more (its ``end_step`` is past):
        then not even the epoch's logs are saved (``end_step=0`` is how the reference turns off the
        collections saved by default)."""
        config = self.get_collection(collection).save_config
        return config is not None and config.get_save_config(self.mode).next_save_step(self.mode_step) is None

    def mode_begin(self, mode) -> None:
        if self.closed:
            return
        with self.guard("start training"):
            self.set_mode(mode)
            model = self.tf_state.model
            if model is not None and id(model) != self.tf_state.model_ref:
                self.register_model(model)

    def mode_end(self) -> None:
        self.restore_function()
        if not self.closed:
            self.flush()  # ends the step; a Trial reads everything saved so far, the run stays open

    def batch_begin(self, mode, batch: int = 0) -> None:
        self.restore_function()  # a call that never came (the data ended)
        if self.closed:
            return
        self.tf_state.batch = batch
        if self.mode != mode:
            self.set_mode(mode)
        if not self.next_idle_step():
            self.begin_step()  # ends the previous step
        self.stop_if_asked(mode)
        health = self.health is not None  # every mode: gradients only in TRAIN, the rest in all
        if not self.anything_due() and not health:
            return  # the common step: Keras' own function runs, nothing else happens
        with self.guard("prepare the step's tensors"):
            model = self.tf_state.model
            if model is not None and not self.tf_state.weights and model.weights:
                self.register_model(model)  # built on its first call (a subclassed model)
            kinds = self.capture_kinds(mode)
            if health:
                kinds |= {capture.HEALTH} | self.kept_kinds(mode)
            if not self.swap_in(mode, kinds) and capture.WEIGHTS in kinds:
                for name, variable in self.tf_state.weights:  # read here when the step cannot
                    if self.is_due(name):
                        self.save_for_step(name, snapshot(variable))

    def step_done(self, mode, result, packed, health=None, layout=None, kept=None) -> None:
        """The due step's function returned: save what it computed (each replica's health statistics
        by its hook, with include_workers "all"), end the step."""
        with self.guard("save the step's tensors"):
            replicas = unpack(packed) if packed else [[]]
            with self.together():  # their reductions are on the host already: hand them over at once
                for name, value in replicas[0]:  # the first replica (include_workers "one")
                    self.save_for_step(name, value)
            self.save_replicas(replicas, health, layout, kept)
            self.save_logs(mode, result)
            if mode == ModeKeys.TRAIN:
                self.save_optimizer_variables(getattr(self.tf_state.model, "optimizer", None))

    def health_step(self, health, layout: list, kept: dict, logs) -> None:
        """The step's health vector into the flight recorder (before the step ends: a trigger writes);
        ``kept``: the step's tensors the user's collections name, and its logs, saved on a trigger."""
        if layout:
            with self.guard("record the step's health"):
                self.keras_health().record(health, layout[0], kept, logs)

    def replica_health(self, vectors, layout) -> int:
        """Which of a step's replicas' health vectors (several under a distribution strategy) is this
        worker's: the first replica's, or with include_workers "one" the first holding a non-finite value
        or a bad flag (a fault in one replica's share of the batch is seen at its step)."""
        if len(vectors) == 1 or self.tf_state.replicas or not layout:
            return 0
        flags = slice(2 * len(layout[0][0]), None)
        bad = (
            i for i, v in enumerate(vectors) if not np.isfinite(h := v.numpy()).all() or (h[flags] != 1).any()
        )
        return next(bad, 0)

    def keras_health(self):
        """The plugin's part of health monitoring (smdebug_tf.health.KerasHealth), made on first use."""
        state = self.tf_state
        if state.health is None:
            from smdebug_tf.health import KerasHealth

            state.health = KerasHealth(self)
        return state.health

    def tape_health(self, names: tuple, vector, kept: dict | None = None) -> None:
        """A wrapped tape's step statistics (its variables, gradients and loss) into the recorder."""
        self.health_step(vector, [(names, ())], kept or {}, None)

    def kept_kinds(self, mode) -> frozenset:
        """With health: the kinds of in-graph tensors an included collection names, which each step keeps
        for the flight recorder's trigger (smdebug_tf.capture.build's ``keep_of``)."""
        state = self.tf_state
        key = (self.collections_version, mode, len(state.weights), len(state.layer_names))
        if state.kept_kinds[0] == key:
            return state.kept_kinds[1]

        def named(names) -> bool:
            return any(self.collections_of(n) for n in names)

        kinds = set()
        if named(n for n, _ in state.weights):
            kinds.add(capture.WEIGHTS)
        if mode == ModeKeys.TRAIN and named(state.gradient_names):
            kinds.add(capture.GRADIENTS)
        if named(state.layer_names):
            kinds.add(capture.LAYERS)
        if mode != ModeKeys.PREDICT and named((capture.PREDICTIONS, capture.LABELS)):
            kinds.add(capture.OUTPUTS)
        if named((capture.MODEL_INPUT,)):
            kinds.add(capture.INPUTS)
        state.kept_kinds = (key, frozenset(kinds))
        return state.kept_kinds[1]

    def kept(self, name: str) -> bool:
        """Whether a health step keeps this in-graph tensor for a trigger (an included collection names
        it)."""
        return bool(self.collections_of(name))

    def save_optimizer_variables(self, optimizer=None) -> None:
        """An optimizer's variables (by default the last one wrapped), as the step's update left them
        (once a step)."""
        optimizer = optimizer if optimizer is not None else self.tf_state.optimizer
        if optimizer is None or not self.anything_due():
            return
        pairs = self.refresh_optimizer_variables(optimizer)
        saved = self.saved_this_step()
        for name, variable in pairs:
            if name not in saved and self.save_for_step(name, snapshot(variable)):
                saved.add(name)

    def stop_if_asked(self, mode) -> None:
        model = self.tf_state.model
        if model is not None and self.should_stop():
            setattr(model, _KERAS_MODES[mode][2], True)  # Keras ends its loop after this batch

    # -- what is captured inside the compiled step ------------------------------------------------------
    def capture_kinds(self, mode) -> frozenset:
        state = self.tf_state
        kinds = set()
        unbuilt = state.model is not None and not state.weights  # built by the step: names unknown yet
        due = CollectionKeys.WEIGHTS, CollectionKeys.BIASES
        if any(self.is_due(name) for name, _ in state.weights) or (unbuilt and self.has_due_collection(*due)):
            kinds.add(capture.WEIGHTS)
        if mode == ModeKeys.TRAIN and (
            any(self.is_due(n) for n in state.gradient_names)
            or (unbuilt and self.has_due_collection(CollectionKeys.GRADIENTS))
        ):
            kinds.add(capture.GRADIENTS)
        if any(self.is_due(n) for n in state.layer_names):
            kinds.add(capture.LAYERS)
        if mode != ModeKeys.PREDICT and (self.is_due(capture.PREDICTIONS) or self.is_due(capture.LABELS)):
            kinds.add(capture.OUTPUTS)
        if self.is_due(capture.MODEL_INPUT):
            kinds.add(capture.INPUTS)
        return frozenset(kinds)

    def swap_in(self, mode, kinds: frozenset) -> bool:
        """Put a function in place of Keras' own for this step's one call: the instrumented one when
        tensors of the step are due, else Keras' own, called through so that the hook gets the logs.
        False when the in-graph tensors cannot be captured at this step."""
        state = self.tf_state
        model = state.model
        name, attribute, _ = _KERAS_MODES[mode]
        plain = getattr(model, attribute, None) if model is not None else None
        if plain is None:
            return False
        captured = bool(kinds) and mode not in state.broken
        if captured and getattr(model, "steps_per_execution", 1) > 1:
            self.warn_once(
                "steps_per_execution",
                "smdebug: steps_per_execution=%d: one smdebug step is one execution of that many batches; "
                "gradients, layer tensors, model inputs and outputs are not captured (weights, losses and "
                "metrics are), and health=True records nothing. Compile with steps_per_execution=1 to "
                "save them.",
                model.steps_per_execution,
            )
            captured = False
        instrumented = self.instrumented(name, kinds, plain) if captured else None
        hook = self

        def one_call(arg):
            try:
                return step(arg)
            except (StopIteration, tf.errors.OutOfRangeError):
                raise  # the end of the data, as Keras' own function signals it
            except Exception as exc:  # the step raised (its data, an assertion): training stops
                hook.training_raised(f"training raised {type(exc).__name__}: {_summary(exc)}")
                raise

        def step(arg):
            _put(model, attribute, plain)  # Keras' own function again from the next lookup on
            state.swapped = None
            packed = health = kept = None
            if instrumented is None:
                result = plain(arg)
            else:
                try:
                    result, packed, health, kept = instrumented(arg)
                except (StopIteration, tf.errors.OpError):
                    # the end of the data; or the step failed as it ran (its data, an assertion), as
                    # Keras' own function would, its batch gone: never silently run the next one
                    raise
                except Exception as exc:
                    state.broken.add(mode)
                    hook.warn_once(
                        f"capture:{name}",
                        "smdebug: could not capture tensors from inside the %s step (%s: %s); this mode "
                        "goes on without them",
                        name,
                        type(exc).__name__,
                        exc,
                    )
                    result = plain(arg)
            if health is not None and capture.HEALTH in kinds:
                layout = instrumented.health_layout
                hook.step_done(mode, result, packed, health, layout, kept)
                i = hook.replica_health(health, layout)
                hook.health_step(health[i], layout, of_replica(kept, i), result)
            else:
                hook.step_done(mode, result, packed)
            hook.end_step()
            hook.stop_if_asked(mode)
            return result

        _put(model, attribute, one_call)
        state.swapped = (model, attribute, plain)
        return captured

    def instrumented(self, name: str, kinds: frozenset, plain):
        """The instrumented function for these kinds whose tensors' plans are this step's (each name's as
        ``capture_plan`` gives it now); built, and traced on its first call, when there is none yet."""
        state = self.tf_state
        built = state.functions.setdefault((name, kinds), [])
        if built and built[0][0] is not plain:  # Keras rebuilt its function (compile again)
            built.clear()
        for i, (_, function) in enumerate(built):
            if all(self.capture_plan(n) == plan for n, plan in function.plans.items()):
                if i:
                    built.insert(0, built.pop(i))
                return function
        keep_of = self.kept if capture.HEALTH in kinds else None
        function = capture.build(
            state.model, name, kinds, self.capture_plan, on_built=self.model_built, keep_of=keep_of
        )
        built.insert(0, (plain, function))
        del built[_KEEP_FUNCTIONS:]  # plans that change all the time: do not keep every trace
        return function

    def model_built(self) -> None:
        """While an instrumented step is traced: a model its first call built gets its names now."""
        model = self.tf_state.model
        if model is not None and not self.tf_state.weights and model.weights:
            with self.guard("register the Keras model"):
                self.register_model(model)

    def capture_plan(self, name: str) -> tuple | None:
        """What of a tensor the instrumented step computes at this step: ``((reduction, abs), ...), raw``
        (raw also when its shape is saved), or None when it is not due. As the core will save it:
        reductions of every due collection it belongs to, except collections saved as they are."""
        colls = self.collections_of(name)
        due = self.due_collections
        cached = self.tf_state.plans.get(name)
        if cached is not None and cached[0] is colls and cached[1] is due:
            return cached[2]
        colls_due = due & colls
        plan = None
        if colls_due:
            pairs = tuple(
                dict.fromkeys(
                    (reduction, bool(absolute))
                    for c in colls_due
                    if c.name not in self.scalar_collections
                    for reduction, absolute in c.reduction_config.reduction_pairs()
                )
            )
            raw = any(c.reduction_config.save_raw_tensor or c.reduction_config.save_shape for c in colls_due)
            plan = (pairs, raw)
        self.tf_state.plans[name] = (colls, due, plan)
        return plan

    def restore_function(self) -> None:
        swapped = self.tf_state.swapped
        if swapped is not None:
            model, attribute, plain = swapped
            _put(model, attribute, plain)
            self.tf_state.swapped = None

    # -- logs -------------------------------------------------------------------------------------------
    @staticmethod
    def is_loss(key: str) -> bool:
        return key in ("loss", "val_loss") or key.endswith("_loss")

    @staticmethod
    def flat_logs(logs) -> dict:
        """Logs with a nested dict spread into its keys, as Keras' own metrics results are: a custom
        ``train_step`` returning ``{m.name: m.result() for m in self.metrics}`` gives ``compile_metrics``
        as ``{"mae": ...}`` (``val_compile_metrics``: ``val_mae``)."""
        flat = {}
        for key, value in dict(logs or {}).items():
            if isinstance(value, dict):
                prefix = "val_" if key.startswith("val_") else ""
                flat.update((prefix + k, v) for k, v in TFHook.flat_logs(value).items())
            else:
                flat[key] = value
        return flat

    def save_logs(self, mode, logs) -> None:
        """What Keras' step function returned: its logs, or in predict the batch's predictions."""
        self.include_names(CollectionKeys.METRICS, ["batch"])  # smdebug 1.0 adds it to the logs
        saved = {"batch"} if self.save_for_step("batch", self.tf_state.batch) else set()
        if mode == ModeKeys.PREDICT:
            self.save_structure(capture.PREDICTIONS, logs)
            return
        for key, value in self.flat_logs(logs).items():
            if not self.is_loss(key):
                self.include_names(CollectionKeys.METRICS, [key])
            if self.save_for_step(key, value):
                saved.add(key)
        self.tf_state.logged = (self.step, frozenset(saved))

    def save_structure(self, name: str, value) -> None:
        """A (nested) value: one tensor as ``name``, several as ``name_0``, ``name_1``..."""
        leaves = [v for v in tf.nest.flatten(value) if v is not None]
        if len(leaves) == 1:
            self.save_for_step(name, leaves[0])
        else:
            for i, leaf in enumerate(leaves):
                self.save_for_step(f"{name}_{i}", leaf)

    # -- TensorFlow-specific API (reference: TensorFlow specific Hook API) ------------------------------
    def wrap_optimizer(self, optimizer):
        """Return the same optimizer, its gradients now seen by the hook (its ``apply`` is wrapped on
        this instance; a LossScaleOptimizer's gradients are saved unscaled)."""
        if not hasattr(optimizer, "apply"):
            self.warn_once(
                "optimizer",
                "smdebug: wrap_optimizer expects a keras.optimizers.Optimizer, got %s; gradients are not saved",
                type(optimizer).__name__,
            )
            return optimizer
        self.tf_state.optimizer = optimizer
        return capture.wrap_optimizer(
            optimizer,
            on_eager_gradients=self.eager_gradients,
            on_eager_applied=self.eager_applied,
            on_applying=self.applying if self.health is not None else None,
        )

    def applying(self, pairs, optimizer) -> None:
        """With health, a custom loop's wrapped optimizer is about to apply these gradients: a wrapped
        tape's step is recorded now, with the gradients the update uses (smdebug_tf.tape)."""
        traced = self.tf_state.tape_health
        self.tf_state.tape_health = None
        graph = tf.compat.v1.get_default_graph() if tf.inside_function() else None
        if traced is not None and traced[0] is graph:
            from smdebug_tf.tape import record_health

            with self.guard("record the step's health"):
                record_health(self, pairs, traced[1], capture.loss_scale(optimizer))

    def wrap_tape(self, tape):
        """Return a tape that behaves as ``tape`` and shows the hook its loss, gradients and variables;
        each ``with`` block of it is one step (TRAIN mode)."""
        if not isinstance(tape, tf.GradientTape):
            self.warn_once(
                "tape",
                "smdebug: wrap_tape expects a tf.GradientTape, got %s; nothing is saved from it",
                type(tape).__name__,
            )
            return tape
        from smdebug_tf.tape import WrappedTape

        self.set_mode(ModeKeys.TRAIN)
        return WrappedTape(self, tape)

    # custom loops: called by WrappedTape and the wrapped optimizer (eager values)
    def tape_step_begin(self) -> None:
        if self.closed:
            return
        if self.mode == ModeKeys.GLOBAL:
            self.set_mode(ModeKeys.TRAIN)
        self.begin_step()

    def saved_this_step(self) -> set[str]:
        state = self.tf_state
        if state.saved_step != self.step:
            state.saved_step = self.step
            state.saved = set()
        return state.saved

    def tape_tensors(self, pairs, loss, weights=None) -> None:
        """A tape's gradients (with their variables), its loss, and the variables' values."""
        if not self.anything_due():
            return
        saved = self.saved_this_step()
        named = self.include_variables([v for v, _ in pairs])
        values = weights if weights is not None else [snapshot(v) for _, v in named]
        for (name, _), (variable, grad), value in zip(named, pairs, values):
            gname = capture.gradient_name(variable)
            if self.save_for_step(gname, grad):
                saved.add(gname)
            self.save_for_step(name, value)
        if loss is not None:
            self.save_for_step("loss", loss)

    def eager_gradients(self, pairs) -> None:
        """Gradients a wrapped optimizer applies in eager code (custom loops without a wrapped tape)."""
        if not self.anything_due():
            return
        with self.guard("save the optimizer's gradients"):
            saved = self.saved_this_step()
            for variable, grad in pairs:
                name = capture.gradient_name(variable)
                if name not in saved and self.save_for_step(name, grad):
                    saved.add(name)

    def eager_applied(self, optimizer, traced: bool = False) -> None:
        """A wrapped optimizer applied its update in eager code (a custom loop, or fit run eagerly), or
        while a function is traced (a wrapped tape's step then saves its variables)."""
        if traced:
            tape = self.tf_state.traced_tape  # (graph, the wrapped tape's traced step)
            if tape is not None and tape[0] is tf.compat.v1.get_default_graph():
                with self.guard("save the optimizer variables"):
                    tape[1].optimizer_applied(optimizer)
        elif self.anything_due() and self.mode == ModeKeys.TRAIN:
            with self.guard("save the optimizer variables"):
                self.save_optimizer_variables(optimizer)

    def traced_optimizer_variables(self, names, arrays) -> None:
        """The optimizer's variables a traced custom-loop step hands over after its update (due steps)."""
        self.include_names(CollectionKeys.OPTIMIZER_VARIABLES, names)
        saved = self.saved_this_step()
        for name, array in zip(names, arrays):
            if name not in saved and self.save_for_step(name, array):
                saved.add(name)

    def save_tensor(self, tensor_name, tensor_value, collections_to_write="default"):
        """Save a TF tensor, variable (its value now) or numpy array at the current step; before the
        first step, into the first step (the core keeps it: no step of its own before training)."""
        if isinstance(tensor_value, (tf.Tensor, tf.Variable)):
            self.check_concrete(tensor_name, tensor_value, "save_tensor")
        super().save_tensor(tensor_name, snapshot(tensor_value), collections_to_write)

    def save_scalar(self, name, value, sm_metric=False, timestamp=None):
        """Save a scalar at the current step (before the first step: into the first step);
        ``sm_metric=True`` also lists it in sm_metrics (which is only ever written locally)."""
        if isinstance(value, (tf.Tensor, tf.Variable)):
            self.check_concrete(name, value)
            value = value.numpy()
        super().save_scalar(name, value, sm_metric=sm_metric, timestamp=timestamp)
        if sm_metric:
            self.add_to_collection(CollectionKeys.SM_METRICS, f"scalar/{name}")

    def record_tensor_value(self, tensor_name, tensor_value) -> None:
        """smdebug 1.0's deprecated form of ``save_tensor`` for a value a custom loop computes (a metric):
        the value joins the ``metrics`` collection and is saved at the steps that collection is due."""
        self.warn_once("record_tensor_value", "smdebug: record_tensor_value is deprecated; use save_tensor")
        if not isinstance(tensor_name, str):
            raise SMDebugTypeError(
                f"record_tensor_value(tensor_name, tensor_value): tensor_name must be a str, got "
                f"{type(tensor_name).__name__}"
            )
        if isinstance(tensor_value, (tf.Tensor, tf.Variable)):
            self.check_concrete(tensor_name, tensor_value, "record_tensor_value")
        value = snapshot(tensor_value)
        self.include_names(CollectionKeys.METRICS, [tensor_name])
        if not self.defer(self.record_tensor_value, tensor_name, value):
            self.save_for_step(tensor_name, value)

    @staticmethod
    def check_concrete(name: str, value, method: str = "save_scalar") -> None:
        """A clear error for a value to save that has none: a TF 1.x graph's tensor (outside a session
        run) or one being traced in a tf.function."""
        symbolic = isinstance(value, tf.Tensor) and not hasattr(value, "numpy")
        if symbolic or (isinstance(value, tf.Variable) and not tf.executing_eagerly()):
            raise SMDebugTypeError(
                f"{method}({name!r}): {value.name} is a symbolic tensor, which has no value outside a session "
                "run (or in a tf.function being traced): save the value the run returned, or add the tensor "
                "to a collection (hook.add_to_collection) to save it at that collection's steps"
            )

    def add_to_collection(self, collection_name, variable) -> None:
        """Add a tensor name, or a TF variable / named tensor (or a list of them), to a collection."""
        if isinstance(variable, str):
            super().add_to_collection(collection_name, variable)
        else:
            self.get_collection(collection_name).add(variable)

    def defer(self, method, *args) -> bool:
        """Keep a record_tensor_value for the first step when no step has begun yet (True if kept);
        save_scalar and save_tensor are kept by the core."""
        if self.step >= 0 or self.in_step or self.closed:
            return False
        self.tf_state.pending.append((method, args))
        return True

    def begin_step(self, step=None, mode_step=None) -> None:
        super().begin_step(step, mode_step)
        pending = self.tf_state.pending
        if pending and self.in_step:
            self.tf_state.pending = []
            for method, args in pending:
                with self.guard("save a value given before training"):
                    method(*args)

    def training_raised(self, reason: str | None = None) -> None:
        """Training raised inside fit (evaluate, predict): with health, the recorder is written now
        (once: not again for a step a raise, a signal or the excepthook wrote it for already)."""
        self.tf_state.fitting = False
        if self.health is None or self.closed:
            return
        if reason is None:  # the exception, when this runs while it is handled
            kind, value, _ = sys.exc_info()
            reason = "training raised inside fit (its on_train_end never came)"
            if value is not None:
                reason = f"training raised {kind.__name__}: {_summary(value)}"
        with self.guard("write the health recorder"):
            if self.health.raised(reason) and self.in_step:
                self.end_step()  # the trigger writes at the end of the step

    def close(self) -> None:
        if self.tf_state.fitting:  # closed inside fit, or after a fit that raised
            self.training_raised()
        self.restore_function()
        if self.tf_state.pending and not self.closed:
            self.begin_step()  # saved before any step: they get the first one
        for replica in self.tf_state.replicas:
            replica.close()
        super().close()


def of_replica(kept: dict | None, i: int) -> dict:
    """Replica ``i``'s tensors of those a health step keeps for a trigger (each replica's)."""
    return {name: tensors[i] for name, tensors in (kept or {}).items() if i < len(tensors)}
