"""The MXNet Gluon hook: ``register_block`` for the model and for the loss block.

A step starts when a registered model block's forward starts (as in smdebug 1.0). The parameters and
their gradients are saved at the end of the step, so a step's weights are the ones its ``trainer.step``
produced and its gradients the ones its ``backward`` computed: they are read when the next forward
starts, when the mode changes (deciding as smdebug 1.0.34 does, see save_parameter), or when the hook
closes. Block inputs and outputs (``<block>_input_<i>``,
``<block>_output_<i>``) come from forward hooks on the model's blocks, and from MXNet's op hook inside
hybridized blocks (smdebug_mxnet.hybrid); a loss block's from its own forward hook.

Reading an NDArray waits for MXNet's engine to compute it. Block tensors (the losses among them) are
therefore read when the step ends, with its parameters: one wait per step, at its end, instead of one in
the middle of the step that would let the engine run dry while the training thread waits. A block's
outputs are new arrays it made, kept as they are until then; its inputs may be buffers the script refills
(a data batch), so they are copied on the engine (in order with later writes to them, without waiting).

When no tensor of the model's blocks can be saved (parameters and losses only), the next step begins when
the model's forward pass has been queued rather than when it starts: the previous step's tensors are read
and saved while MXNet's engine computes that forward pass, instead of with the engine idle. A forward
pass does not change trained parameters or gradients (MXNet even updates batch norm's running statistics
in the backward pass); parameters without gradients, which a custom block's forward might write, are
copied on the engine when the forward starts all the same, so that their saved values are the step's own.
"""

from __future__ import annotations

import functools
import warnings
import weakref

import mxnet as mx
from mxnet import autograd
from mxnet.ndarray import NDArray
from mxnet.symbol import Symbol

from smdebug.plugin import BaseHook, CollectionKeys, ModeKeys
from smdebug_mxnet import workers
from smdebug_mxnet.collection import (
    BUILTIN_PATTERNS,
    GRADIENT_PREFIX,
    INPUT_SUFFIX,
    OUTPUT_SUFFIX,
    Collection,
)
from smdebug_mxnet.hybrid import HybridTaps

HYBRIDIZE_WARNING = r'(?s)".*" is being hybridized while still having forward hook'

# Collections whose tensors are parameters, gradients or loss outputs: none needs the layers' tensors.
PARAMETER_COLLECTIONS = frozenset(
    {CollectionKeys.WEIGHTS, CollectionKeys.BIASES, CollectionKeys.GRADIENTS, CollectionKeys.LOSSES}
)


class Hook(BaseHook):
    framework = "mxnet"
    collection_class = Collection
    builtin_patterns = BUILTIN_PATTERNS
    default_include_collections = (CollectionKeys.LOSSES,)
    tensor_types = (NDArray,)

    def setup(self) -> None:
        # Weak references only: a hook alive at interpreter exit must not keep the script's blocks (and
        # through their Trainer a distributed kvstore, which aborts when freed that late) alive.
        self.models = weakref.WeakSet()  # registered blocks whose forward starts a step
        self.registered = weakref.WeakSet()  # every registered block (models and losses)
        self.hooked = weakref.WeakSet()  # the models' blocks carrying this hook's forward hook for good
        self.armed = True  # whether the registered blocks carry it (not on idle steps: see arm)
        self.step_hooks: list = []  # their HookHandles
        self.parameters = weakref.WeakKeyDictionary()  # model -> weak references to its Parameters
        self.last_model = None  # a weak reference to the model of the current step
        self.params_saved_step = None  # the step whose parameters were saved already
        self.taps = HybridTaps(self)
        self.pending_tensors: dict = {}  # save_tensor's values, saved when the next step starts
        self.pending_step = (None, frozenset())  # (step, names) of save_tensor's values saved at its start
        self.ndarray_calls = 0  # forward hooks that saw NDArrays (a hybridized model's children do not)
        self.calls_at_start = 0
        self.deferred: list = []  # (name, engine copy) of the step's block tensors, saved at its end
        self.delayed = None  # (model, calls at its start): a step to begin when its forward is queued
        self.snapshots: dict = {}  # engine copies of parameters without gradients, for a delayed step
        self.children = weakref.WeakKeyDictionary()  # model -> weak references to its blocks (not itself)
        self.children_version = None  # the collections_version the children's hooks were chosen at
        self.health_part = None  # with health=True: smdebug_mxnet.health.MXNetHealth
        if self.health is not None:
            from smdebug_mxnet.health import MXNetHealth

            self.health_part = MXNetHealth(self)

    # -- distributed -------------------------------------------------------------------------------
    def worker_name(self) -> str:
        found = workers.rank()
        if found is not None:
            return f"worker_{found}"
        if workers.unnamed_ps_worker():
            self.warn_once(
                "worker",
                "smdebug: this parameter-server worker has no kvstore yet, so it is saved as worker_0: "
                "create it (kv = mx.kv.create('dist_sync'); gluon.Trainer(..., kvstore=kv)) before the first "
                "forward to name each worker by its rank",
            )
        return super().worker_name()

    def num_workers(self) -> int:
        found = workers.size()
        return found if found is not None else super().num_workers()

    # -- MXNet specific hook API (reference: register_block) ---------------------------------------
    def register_block(self, block) -> None:
        """Save this Gluon block's tensors: a model (its forward starts a step; parameters, gradients and,
        when a collection asks, its blocks' inputs/outputs) or a loss block (its outputs are the losses)."""
        # MXNet warns (8 lines) when a block with hooks is hybridized that a hybridized child's hooks do
        # not run: this plugin captures hybridized blocks itself (smdebug_mxnet.hybrid), nothing is lost
        warnings.filterwarnings("ignore", message=HYBRIDIZE_WARNING, category=UserWarning)
        if not isinstance(block, mx.gluon.Block):
            self.warn_once(
                f"register:{type(block).__name__}",
                "smdebug: register_block expects a mxnet.gluon.Block, got %s; not registered",
                type(block).__name__,
            )
            return
        if block in self.registered:
            self.warn_once(
                f"registered:{block.name}",
                "smdebug: block %s is registered with this hook already",
                block.name,
            )
            return
        self.registered.add(block)
        if self.health_part is not None:
            self.health_part.watch(block)
        if self.armed and block not in self.hooked:
            self.step_hooks.append(block.register_forward_hook(self.block_forward))
        if isinstance(block, mx.gluon.loss.Loss):
            return
        self.models.add(block)
        block.register_forward_pre_hook(self.model_forward_pre)
        self.children_version = None  # its blocks get a forward hook when the next step starts

    register_hook = register_block  # smdebug 1.0's other name for it

    def arm(self, armed: bool) -> None:
        """The registered blocks' forward hooks: attached for a step that may save something, removed for
        an idle one (each is a call into Python at every step). The models' blocks keep theirs: a
        hybridized block's graph may be built at any step (smdebug_mxnet.hybrid)."""
        if armed == self.armed:
            return
        self.armed = armed
        if armed:
            self.step_hooks = [
                block.register_forward_hook(self.block_forward)
                for block in self.registered
                if block not in self.hooked
            ]
        else:
            for handle in self.step_hooks:
                handle.detach()
            self.step_hooks = []

    # -- MXNet callbacks ---------------------------------------------------------------------------
    def model_forward_pre(self, block, inputs) -> None:
        if self.closed:  # (MXNet keeps a block's forward hooks: a hook registered on it later does the work)
            return
        if self.health_part is not None:
            self.health_part.collect()  # the step that ends, before the next one's forward
            with self.guard("record the step's health"):
                self.health_part.model_input(block, inputs)
        if (
            self.delayed is None
            and not (self.deferred or self.pending_tensors)
            and self.children_version == self.collections_version  # (else start_step hooks them)
            and self.next_idle_step()  # the step that ends and the one that begins save nothing
        ):
            if self.armed:
                self.arm(False)
            if self.last_model is None or self.last_model() is not block:
                self.last_model = weakref.ref(block)
            self.calls_at_start = self.ndarray_calls
            return
        with self.guard("start a step"):
            self.arm(True)
            self.start_delayed()
            if self.in_step and self.anything_due() and self.can_delay(block):  # else nothing to read
                self.snapshot_untrained()
                self.delayed = (weakref.ref(block), self.ndarray_calls)
                return
            self.start_step(block, self.ndarray_calls)
        self.raise_if_stop_requested()

    def start_step(self, block, calls_at_start: int) -> None:
        if self.in_step:
            self.save_deferred()
            self.save_parameters()
        self.last_model = weakref.ref(block)
        self.calls_at_start = calls_at_start
        self.begin_step()
        if self.children_version != self.collections_version:
            self.hook_children()
        self.save_pending_tensors()
        if self.layers_wanted():
            self.taps.attach(block)

    def start_delayed(self) -> None:
        """Begin the step whose start was delayed (its model's forward was queued, or it failed)."""
        if self.delayed is None:
            return
        (ref, calls), self.delayed = self.delayed, None
        block = ref()
        if block is not None:
            self.start_step(block, calls)

    def children_of(self, model) -> list:
        refs = self.children.get(model)
        if refs is None:
            found = []
            model.apply(found.append)
            refs = self.children[model] = [weakref.ref(c) for c in found if c is not model]
        return [child for ref in refs if (child := ref()) is not None]

    def hook_children(self) -> None:
        """A forward hook on each block of the models whose inputs or outputs an included collection may
        hold (and only on those: every hook is a call at every step). They are in place before a model's
        first forward, when a hybridized model builds its graph (smdebug_mxnet.hybrid)."""
        self.children_version = self.collections_version
        for model in list(self.models):
            for child in self.children_of(model):
                if (
                    child not in self.hooked
                    and child not in self.registered
                    and self.layer_wanted(child.name)
                ):
                    self.hooked.add(child)
                    child.register_forward_hook(self.block_forward)

    def can_delay(self, block) -> bool:
        """Whether no input or output of the model's blocks can be due: nothing of the coming step is then
        saved before the model's forward pass ends, and the step can begin there."""
        return not any(self.layer_wanted(child.name) for child in self.children_of(block))

    def snapshot_untrained(self) -> None:
        """Engine copies of the due parameters a forward pass could write (those without gradients),
        taken before it runs; saved with the other parameters when the step begins."""
        block = self.last_model() if self.last_model is not None else None
        if block is None or not self.anything_due():
            return
        for ref, name, _ in self.parameter_refs(block):
            param = ref()
            if param is not None and param.grad_req == "null" and self.is_due(name):
                with self.guard(f"save parameter {name}"), autograd.pause():
                    self.snapshots[name] = mx.nd._internal._copy(param.data(param.list_ctx()[0]))

    def block_forward(self, block, inputs, outputs) -> None:
        if self.closed:
            return
        if isinstance(outputs, Symbol) or (
            isinstance(outputs, (list, tuple)) and outputs and isinstance(outputs[0], Symbol)
        ):
            with self.guard("map a hybridized block's tensors"):
                self.taps.record(block, inputs, outputs)
            return
        if self.delayed is not None and (block is self.delayed[0]() or block in self.registered):
            with self.guard("start a step"):
                self.start_delayed()  # the model's forward pass is queued (or a loss block runs)
            self.raise_if_stop_requested()
        self.ndarray_calls += 1
        if self.taps.mapped:
            with self.guard("save a hybridized block's layer tensors"):
                self.taps.called(block, inputs)
        if not self.anything_due():
            return
        if (
            self.last_model is not None
            and block is self.last_model()
            and self.ndarray_calls == self.calls_at_start + 1
        ):
            self.check_hybridized(block)
        with self.guard("save block tensors"):
            self.defer_numbered(block.name + INPUT_SUFFIX, inputs, copy=True)
            self.defer_numbered(block.name + OUTPUT_SUFFIX, outputs, copy=False)

    # -- block tensors, read when the step ends ----------------------------------------------------
    def defer_numbered(self, prefix: str, values, copy: bool) -> None:
        """Each NDArray of a (nested) tuple, list or dict as ``<prefix><i>`` (BaseHook.numbered_tensors),
        deferred to the step's end."""
        for name, value in self.numbered_tensors(prefix, values):
            self.defer(name, value, copy)

    def defer(self, name: str, value, copy: bool = True) -> None:
        """Save a block tensor when the step ends if it is due now. ``copy``: the array may be written
        to before then, so a copy is made on MXNet's engine, in order with those writes (nothing waits)."""
        if not self.is_due(name):
            return
        if copy:
            try:
                with autograd.pause():  # the copy is no part of the user's graph
                    value = mx.nd._internal._copy(value)
            except Exception:  # an array the copy operator does not take: read now, as it is
                self.save_for_step(name, value)
                return
        self.deferred.append((name, value))

    def save_deferred(self) -> None:
        """The step's deferred block tensors, their reductions started together."""
        if not self.deferred:
            return
        deferred, self.deferred = self.deferred, []
        with self.together():
            for name, value in deferred:
                with self.guard(f"save {name}"):
                    self.save_for_step(name, value)

    def end_step(self) -> None:
        if self.health_part is not None:
            self.health_part.collect()  # (a trigger it sets writes the recorder as the step ends)
        if self.deferred:  # whatever ends the step (flush, set_mode, close) saves them into it first
            with self.guard("save block tensors"):
                self.save_deferred()
        super().end_step()

    def check_hybridized(self, block) -> None:
        """The model ran as one cached graph: its layers' tensors come only from a graph built while
        their blocks had the hook's forward hook (registered, and wanted by a collection)."""
        if id(block) in self.taps.graphs or not self.layers_wanted():
            return
        # (a collection of the model's own inputs/outputs only loses nothing)
        if any(self.layer_wanted(child.name) for child in self.children_of(block)):
            self.warn_once(
                f"hybridized:{block.name}",
                "smdebug: the inputs/outputs of the layers inside hybridized block %s cannot be saved: "
                "its graph was built before register_block or before a collection asked for them (register "
                "it and configure collections before its first forward, or hybridize it again); its "
                "parameters, gradients, own inputs/outputs and losses are saved",
                block.name,
            )

    # -- parameters --------------------------------------------------------------------------------
    def save_parameters(self, mode=None) -> None:
        """The current step's parameters and gradients. ``mode``: the mode just set, whose configuration
        decides instead of the step's own (below)."""
        block = self.last_model() if self.last_model is not None else None
        if block is None or self.params_saved_step == self.step or not self.anything_due():
            return
        self.params_saved_step = self.step
        snapshots, self.snapshots = self.snapshots, {}
        with self.together():  # every parameter's reductions in one plugin call
            for ref, name, gradient in self.parameter_refs(block):
                param = ref()
                if param is None:
                    continue
                with self.guard(f"save parameter {name}"):
                    ctx = param.list_ctx()[0]
                    if name in snapshots:
                        self.save_parameter(name, functools.partial(snapshots.get, name), mode)
                    else:
                        self.save_parameter(name, functools.partial(param.data, ctx), mode)
                    if param.grad_req != "null":
                        self.save_parameter(gradient, functools.partial(param.grad, ctx), mode)

    def parameter_refs(self, block) -> list:
        """(weak reference, name, gradient name) of each of the model's parameters."""
        refs = self.parameters.get(block)
        if refs is None:  # a Parameter holds its Trainer: weak references, as for the blocks
            refs = self.parameters[block] = [
                (weakref.ref(p), p.name, GRADIENT_PREFIX + p.name) for p in block.collect_params().values()
            ]
        return refs

    def save_parameter(self, name: str, value, mode) -> None:
        if mode is None:
            if self.is_due(name):
                self.save_for_step(name, value())
            return
        # smdebug 1.0.34 reads a step's parameters when the next step starts, so after a mode change it
        # decides with the new mode's configuration at that mode's latest step (-1 before its first one,
        # never due): the last TRAIN step before evaluation loses them, the last EVAL step before training
        # gets the gradients. The same names and steps as 1.0.34's, for the same script.
        step = self.mode_steps.get(mode, -1)
        skipped = self.train_only_collections if mode in (ModeKeys.EVAL, ModeKeys.PREDICT) else ()
        due = [
            c.name
            for c in self.collections_of(name)
            if c.name not in skipped and c.save_config.should_save_step(mode, step)
        ]
        if due:
            super().save_tensor(name, value(), due)  # now, into this step

    def layers_wanted(self) -> bool:
        """Whether a collection due now may hold block inputs/outputs (beyond the loss blocks')."""
        return any(c.name not in PARAMETER_COLLECTIONS for c in self.due_collections)

    def set_mode(self, mode) -> None:
        with self.guard("start a step"):
            self.start_delayed()
        if self.in_step and isinstance(mode, ModeKeys) and mode != self.mode:
            with self.guard("save parameters"):
                self.save_deferred()
                self.save_parameters(mode)  # the step ends with the mode: its parameters are read now
        super().set_mode(mode)

    def save_tensor(self, tensor_name: str, tensor_value, collections_to_write="default") -> None:
        """Save a tensor (NDArray or numpy) into the given collections when the next step starts, as
        smdebug 1.0.34 does for MXNet (the latest value of a name wins). Without a registered model, or
        after the last step (1.0.34 drops it there), it is saved into the current step."""
        with self.guard("start a step"):
            self.start_delayed()
        if not self.models or self.closed:
            super().save_tensor(tensor_name, tensor_value, collections_to_write)
        else:
            self.pending_tensors[tensor_name] = (tensor_value, collections_to_write)

    def save_scalar(self, name: str, value, sm_metric: bool = False, timestamp: float | None = None) -> None:
        """Save a scalar into the current step; before the first step, into the first step (the core keeps
        it, as 1.0.34 saves it)."""
        with self.guard("start a step"):
            self.start_delayed()
        super().save_scalar(name, value, sm_metric, timestamp)

    def save_pending_tensors(self, closing: bool = False) -> None:
        if not self.pending_tensors:
            return
        step, taken = self.pending_step
        if closing and step == self.step:
            # a value given after the last step, whose name that step holds already (from the call before,
            # as in 1.0.34's run): it has no step of its own, and does not displace the step's value
            for name in taken & self.pending_tensors.keys():
                del self.pending_tensors[name]
                self.record_unsaved_tensor(
                    name,
                    f"save_tensor after the last step: step {step} holds the value given before it (as "
                    "smdebug 1.0.34 saves it, at the next step's start)",
                )
        pending, self.pending_tensors = self.pending_tensors, {}
        self.pending_step = (self.step, frozenset(pending))
        for name, (value, collections) in pending.items():
            with self.guard(f"save tensor {name}"):
                super().save_tensor(name, value, collections)

    def flush(self) -> None:
        with self.guard("start a step"):
            self.start_delayed()
        super().flush()

    def close(self) -> None:
        if not self.closed:
            with self.guard("start a step"):
                self.start_delayed()
            if self.health_part is not None:
                self.health.raised()  # (closing in try/finally: the last step saves its tensors)
                self.health_part.collect()
                self.health_part.close()
        if self.in_step and not self.closed:
            with self.guard("save parameters"):
                self.save_deferred()
                self.save_parameters()
        if not self.closed:
            self.save_pending_tensors(closing=True)
        super().close()
