"""Always-on health for MXNet Gluon (``Hook(health=True)``): every step's statistics into the core's
flight recorder (smdebug.health), and where the first non-finite value came from. Steps of every mode
are recorded: an EVAL or PREDICT step has its weights and its loss, no gradients.

MXNet shows the hook a step's gradients only once the next forward starts (or the mode changes, or the
hook closes), after ``trainer.step`` has changed the weights: a step is recorded when its Trainer's
``step`` or ``update`` returns (_watch_trainers), else then. A step's record holds the l2 norm and the
max |x| of every parameter's weight (as the step left it, the value the hook saves as that step's weight),
every gradient (final since the step's backward) and the loss (the registered loss block's output), in
one call of a cached MXNet graph over all of them (BLAS dot products and oneDNN pooling, see Statistics) that
writes straight into the recorder's row, an NDArray ring on the parameters' context.

On the CPU the row is read and judged at once, while the step's tensors are still as the step left them
(the next backward overwrites the gradients in place, the next ``trainer.step`` the weights): on a
trigger the step's tensors the user's collections name are saved into it, whatever the save interval.
The wait costs next to nothing there: the training thread, not MXNet's engine, is what limits a CPU step
(measured in-process against reading the row a step later: no difference beyond the noise). On a GPU
the row is read when the next step is recorded (nothing waits for the device), a save step's at once, so
only a save step's tensors are saved on a trigger (as with torch on a GPU).

Provenance, cheaply and correctly although the weights have moved on: a re-run of the bad step's forward
pass is impossible (its weights are gone), and checks switched on only once something is seen would look
at the next step, whose every output a NaN weight already spoils. So every step keeps, lazily, what the
check needs: each of the model's blocks' forward hooks keeps a reference to its inputs and outputs (no
computation), and the model's input batch gets one queued reduction (its sum of |x|: non-finite if any
value is; a buffer the script refills later is judged as the step saw it; an engine copy of it is kept
only when a collection names it). They are kept until the step's row is read and read only when that row
holds the run's first non-finite value (or, on a trigger, to save those the collections name), in the
order the step computed them: the input batch, the blocks' outputs in the order their forward passes
ended (a child ends before its parent: the first bad one is where the value appeared), the loss, then the
gradient nearest the output. A hybridized model runs its blocks as one graph without their forward hooks:
while MXNet builds that graph they say which node outputs are theirs, and MXNet's op hook hands those
over as the graph runs. The graph reuses its buffers (in place, or for later nodes), so each of those is
judged by an all-finite flag queued as it is reported (one operator), and copied only when a collection
names it.
"""

from __future__ import annotations

import functools
import operator
import weakref

import mxnet as mx
import numpy as np
from mxnet import autograd

from smdebug.plugin import BaseHook, ModeKeys
from smdebug_mxnet.collection import GRADIENT_PREFIX, INPUT_SUFFIX, OUTPUT_SUFFIX
from smdebug_mxnet.hybrid import reported_names, symbols_in

ABSENT = -1.0  # a tensor the step did not have: norms are never negative (smdebug.health)
GRADIENT_MODES = (ModeKeys.TRAIN, ModeKeys.GLOBAL)  # the modes whose steps compute gradients
POOLED = 4096  # arrays larger than this get their max |x| by pooling, not by MXNet's slow reduction


class Statistics:
    """A cached MXNet graph over a list of arrays of known shapes and dtypes (None: a tensor the step
    does not have, ABSENT in both halves): their l2 norms, then their max |x|, as one float32 vector.
    MXNet's reduction operators take several nanoseconds an element on a CPU (a 50k-element ``max``:
    0.17 ms), so large arrays are not reduced by them: the l2 norm is the square root of a BLAS dot
    product of the array with itself, and the max |x| a global max pooling of |x| (oneDNN's kernel),
    which skips NaN: a NaN norm (a NaN anywhere) stands for the max as well."""

    def __init__(self, shapes: list[tuple | None], dtypes: list):
        norms, maxes = [], []
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
            if shape is None:
                continue
            flat = mx.sym.reshape(mx.sym.var(f"t{i}"), shape=(-1,))
            if np.dtype(dtype) != np.float32:
                flat = mx.sym.cast(flat, dtype="float32")
            norms.append(mx.sym.dot(flat, flat))
            if int(np.prod(shape, dtype=np.int64)) <= POOLED:
                maxes.append(mx.sym.max(mx.sym.abs(flat), axis=0, keepdims=True))
            else:
                image = mx.sym.reshape(mx.sym.abs(flat), shape=(1, 1, 1, -1))
                pooled = mx.sym.Pooling(image, kernel=(1, 1), pool_type="max", global_pool=True)
                maxes.append(mx.sym.reshape(pooled, shape=(1,)))
        norms = mx.sym.sqrt(mx.sym.concat(*norms, dim=0))
        maxes = mx.sym.where(norms != norms, norms, mx.sym.concat(*maxes, dim=0))
        present = [shape is not None for shape in shapes]
        graph = mx.sym.concat(_spread(norms, present), _spread(maxes, present), dim=0)
        # static shapes: a call costs a few microseconds of Python instead of a graph set-up
        self.op = mx.nd.CachedOp(graph, [("static_alloc", "true"), ("static_shape", "true")])
        # the graph takes its inputs in the order it meets them
        self.inputs = operator.itemgetter(*[int(name[1:]) for name in graph.list_inputs()])

    def __call__(self, arrays: list, out: mx.nd.NDArray) -> None:
        picked = self.inputs(arrays)
        self.op(*(picked if isinstance(picked, tuple) else (picked,)), out=out)


def _spread(values, present: list[bool]):
    """A symbol of the present tensors' values spread over all of them, ABSENT where one is missing."""
    if all(present):
        return values
    pieces, taken, i = [], 0, 0
    while i < len(present):
        run = i
        while run < len(present) and present[run] == present[i]:
            run += 1
        if present[i]:
            pieces.append(mx.sym.slice_axis(values, axis=0, begin=taken, end=taken + run - i))
            taken += run - i
        else:
            pieces.append(mx.sym.full(shape=(run - i,), val=ABSENT, dtype="float32"))
        i = run
    return mx.sym.concat(*pieces, dim=0) if len(pieces) > 1 else pieces[0]


class NodeOutput:
    """A hybridized graph's node output: its all-finite flag (queued; None: not floating), its copy or None."""

    __slots__ = ("finite", "kept")

    def __init__(self, finite, kept):
        self.finite, self.kept = finite, kept


def _nonfinite(value) -> bool:
    if isinstance(value, NodeOutput):
        return value.finite is not None and not value.finite.asnumpy()[0]
    return (
        isinstance(value, mx.nd.NDArray)
        and value.size > 0
        and np.issubdtype(value.dtype, np.floating)
        and not np.isfinite(value.asnumpy()).all()
    )


LIVE: weakref.WeakSet = weakref.WeakSet()  # the MXNetHealth parts of open hooks


def _watch_trainers() -> None:
    """Have ``Trainer.step`` and ``Trainer.update`` record the hooks' current steps once they return:
    the gradients are final and the weights as the update left them, what the next forward (where a
    step is otherwise recorded) would see, unless the script zeroes the gradients in between, as it
    does with gradient accumulation (grad_req 'add'); ``zero_grad`` judges the row first, while the
    step's tensors are intact (to save them on a trigger), and records it first if Trainers updated
    only parts of the model (one a layer). Wrapped once per process."""
    from mxnet.gluon.parameter import Parameter, ParameterDict

    def after(method, call):
        @functools.wraps(method)
        def wrapped(self, *args, **kwargs):
            result = method(self, *args, **kwargs)
            for health in list(LIVE):
                call(health, self)
            return result

        wrapped.smdebug_wrapped = True
        return wrapped

    def before(method, call):
        @functools.wraps(method)
        def wrapped(self, *args, **kwargs):
            for health in list(LIVE):
                call(health)
            return method(self, *args, **kwargs)

        wrapped.smdebug_wrapped = True
        return wrapped

    for cls, name, wrap, call in (
        (mx.gluon.Trainer, "step", after, MXNetHealth.after_update),
        (mx.gluon.Trainer, "update", after, MXNetHealth.after_update),
        (Parameter, "zero_grad", before, MXNetHealth.before_zero_grad),
        (ParameterDict, "zero_grad", before, MXNetHealth.before_zero_grad),
    ):
        method = getattr(cls, name)
        if not getattr(method, "smdebug_wrapped", False):
            setattr(cls, name, wrap(method, call))


class MXNetHealth:
    """The MXNet hook's part of health monitoring (``hook.health`` is the core's HealthMonitor)."""

    def __init__(self, hook):
        self.hook = hook
        self.monitor = hook.health
        self.loss_blocks: list = []  # names of the registered loss blocks, in registration order
        self._collected = None  # the step last recorded
        # (model name, [(tensor name, queued sum of |x|, the array, its engine copy or None)]) of the step
        self._inputs: list = []
        self._outputs: list = []  # (block name, inputs or None, outputs) of the step, as the forwards ended
        # a hybridized graph's node output -> the blocks it is the output of, innermost first
        self._nodes: dict[str, list[str]] = {}
        self._loss = None  # (tensor name, output) of the step's first loss block call
        self._layout = None  # (key, (parameter, has a gradient), names, loss name, Statistics by loss shape)
        self._ring = None
        self._rows: list = []
        self._late = False  # the ring is on a GPU: rows are read a step late
        self._lagged = None  # (slot, step, mode, mode step, inputs, outputs, loss name) of a row to read
        self._weights_only = None  # the first non-finite record of a row where only weights were, if held
        # the registered models that have run (their parameters are initialized), in the order they first
        # ran: every step records all of them (two models, each starting steps, share one recorder)
        self._ran = weakref.WeakSet()
        self._models: list = []
        self._frozen: list = []  # the watched parameters without gradients (weak references)
        # (step, names, tensors, inputs, outputs) of a step judged before it ended, until the next forward
        self._judged = None
        self._unjudged = None  # (row, tensors, names) of a step recorded but not judged yet (collect)
        self._coverage = weakref.WeakKeyDictionary()  # Trainer -> (key, updates every watched parameter)
        self._updated = None  # the step a Trainer last updated weights in
        self._parameter_names: frozenset = frozenset()  # the layout's weights' and gradients' names
        _watch_trainers()
        LIVE.add(self)

    # -- what the hook tells it ------------------------------------------------------------------------
    def watch(self, block) -> None:
        """A registered block: a loss block's output is the loss; a model's blocks (itself included)
        keep their inputs and outputs for the step."""
        if isinstance(block, mx.gluon.loss.Loss):
            self.loss_blocks.append(block.name)
            block.register_forward_hook(self._on_loss)
        else:
            block.apply(lambda b: b.register_forward_hook(self._on_output))
            self.hook.taps.attach(block)  # a hybridized graph's node outputs: node_output

    def model_input(self, block, inputs) -> None:
        """A model's forward starts (after the previous step was recorded)."""
        if block not in self._ran:
            self._ran.add(block)
            self._models.append(weakref.ref(block))
        self._judged = None  # (its tensors are not kept alive through another step)
        if self._inputs:
            return
        hook = self.hook
        flags = []
        with autograd.pause():
            for i, value in enumerate(hook.tensors_in(inputs)):
                name = f"{block.name}{INPUT_SUFFIX}{i}"
                # the buffer may be refilled before the step is judged: a copy, if a collection names it
                kept = mx.nd._internal._copy(value) if hook.collections_of(name) else None
                flag = mx.nd.sum(mx.nd.abs(value)) if np.issubdtype(value.dtype, np.floating) else None
                flags.append((name, flag, value, kept))
        self._inputs.append((block.name, flags))

    def _on_output(self, block, inputs, outputs) -> None:
        symbols = list(symbols_in(outputs))
        if not symbols:
            # a model's own inputs are kept by model_input
            self._outputs.append((block.name, None if block in self.hook.models else inputs, outputs))
            return
        # a hybridized graph being built: which of its node outputs are this block's (a child's forward
        # ends before its parent's: the innermost block comes first, a Dense's relu before the Dense)
        for symbol in symbols:
            for node_output in symbol.list_outputs():
                for reported in reported_names(node_output):
                    blocks = self._nodes.setdefault(reported, [])
                    if block.name not in blocks:
                        blocks.append(block.name)

    def node_output(self, node_output: str, value) -> None:
        """A hybridized graph's node output, as its cached graph runs (MXNet's op hook, through
        smdebug_mxnet.hybrid), when it is a block's output. The graph may write its buffer again before
        the step is judged (an operator working in place, a later node reusing the memory): one queued
        all-finite flag judges it as computed, and an engine copy is kept when a collection names it
        (asked with the name of the block's first output in a step, as BaseHook.layer_wanted does)."""
        blocks = self._nodes.get(node_output)
        if blocks is not None:
            hook = self.hook
            with hook.guard("keep a hybridized block's output"), autograd.pause():
                # (only floating values can be non-finite, and all_finite takes nothing else)
                floating = np.issubdtype(value.dtype, np.floating)
                finite, kept = mx.nd.all_finite(value) if floating else None, None
                for block in blocks:
                    if kept is None and hook.collections_of(f"{block}{OUTPUT_SUFFIX}0"):
                        kept = mx.nd._internal._copy(value)
                    self._outputs.append((block, None, NodeOutput(finite, kept)))

    def _on_loss(self, block, inputs, outputs) -> None:
        if self._loss is None and isinstance(outputs, mx.nd.NDArray):
            self._loss = (block.name + OUTPUT_SUFFIX + "0", outputs)

    # -- every step ------------------------------------------------------------------------------------
    def collect(self, judge: bool = True) -> None:
        """Record the hook's current step (once), as it ends, and judge it (on a GPU: when the next step
        ends, a save step's at once). ``judge`` False (a Trainer's update returned): the row is queued
        and judged when the next forward starts, zero_grad is called or the hook closes, so that the
        wait for MXNet's engine still overlaps the script's own work between two steps."""
        hook = self.hook
        if hook.in_step and self._collected != hook.step and not hook.closed:
            self._collected = hook.step
            step = (self._inputs, self._outputs, self._loss)
            self._inputs, self._outputs, self._loss = [], [], None
            self.judge_lagged()
            models = [m for m in (ref() for ref in self._models) if m is not None]
            with hook.guard("record the step's health"):
                recorded = self._record(models, step[2]) if models else None
                if recorded is not None:
                    slot, tensors, names, loss_name = recorded
                    judged = (slot, hook.step, hook.mode, hook.mode_step, step[0], step[1], loss_name)
                    if self._late and not hook.anything_due():
                        self._lagged = judged
                    else:
                        self._unjudged = (judged, tensors, names)
        if judge:
            self.judge_recorded()

    def judge_recorded(self) -> None:
        """Judge the row recorded last, if it waits (see collect)."""
        unjudged, self._unjudged = self._unjudged, None
        if unjudged is not None:
            with self.hook.guard("judge the step's health"):
                self._judge(*unjudged)

    def judge_lagged(self) -> None:
        """Judge the row the last recorded step left to be read (the hook closes: now)."""
        lagged, self._lagged = self._lagged, None
        if lagged is not None:
            with self.hook.guard("judge the step's health"):
                self._judge(lagged, None, self.monitor.names)

    def after_update(self, trainer) -> None:
        """A Trainer updated the weights: the current step is recorded now (see _watch_trainers), if the
        Trainer updates every watched parameter (with one Trainer a layer, the step waits for the next
        forward as without a Trainer)."""
        if self.hook.mode in GRADIENT_MODES:
            self._updated = self.hook.step
            with self.hook.guard("record the step's health"):
                if self._covers(trainer):
                    self.collect(judge=False)

    def before_zero_grad(self) -> None:
        """The script zeroes gradients: a step whose Trainers updated only parts of the model (none
        recorded it) is recorded now, its gradients still intact, rather than at the next forward, which
        would find them zeroed; the row recorded last is judged (see _watch_trainers). A zero_grad before
        the step's update (before backward, as in PyTorch scripts) records nothing."""
        hook = self.hook
        if self._updated == hook.step and hook.mode in GRADIENT_MODES:
            with hook.guard("record the step's health"):
                self.collect()
        else:
            self.judge_recorded()

    def _covers(self, trainer) -> bool:
        """Whether a Trainer updates every parameter with a gradient of the models that ran (cached
        while both stay the same)."""
        models = [m for m in (ref() for ref in self._models) if m is not None]
        params = getattr(trainer, "_params", ())  # (MXNet's list: a Trainer has no public accessor)
        key = (len(params), tuple(id(self.hook.parameter_refs(m)) for m in models))
        known = self._coverage.get(trainer)
        if known is None or known[0] != key:
            updated = {p.name for p in params}
            trained = {
                name
                for m in models
                for ref, name, _ in self.hook.parameter_refs(m)
                if (p := ref()) is not None and p.grad_req != "null"
            }
            known = self._coverage[trainer] = (key, trained <= updated)
        return known[1]

    def close(self) -> None:
        """The hook closes (its last step judged): a held record of non-finite weights is the first."""
        LIVE.discard(self)
        self.judge_lagged()
        judged = self._judged
        # a trigger awaiting the last step's end (training raised, a signal) when the step was judged
        # already, as its trainer.step returned: its tensors now
        if judged is not None and judged[0] == self.hook.step and self.monitor.pending:
            self._saved_step(*judged)
        held, self._weights_only = self._weights_only, None
        if held is not None:
            self.monitor.found(held)

    def _record(self, models: list, loss) -> tuple | None:
        """The step's statistics queued into a new row of the ring: (slot, tensors, names, loss name).
        An evaluation or prediction step has no gradients (the arrays hold the last training step's), and
        a step may have no loss (the loss block did not run)."""
        weights, grads, names, loss_name, ops = self._current_layout(models)
        trained = self.hook.mode in GRADIENT_MODES
        # a frozen parameter trained again (grad_req no longer 'null'): a new layout (a check of the
        # frozen parameters only: none in most runs)
        if trained and any(_alive(ref).grad_req != "null" for ref in self._frozen):
            self._layout = None
            weights, grads, names, loss_name, ops = self._current_layout(models)
        try:
            gradients = [p.list_grad()[0] for p in map(_alive, grads)] if trained else [None] * len(grads)
        except RuntimeError:  # a parameter frozen since (grad_req 'null' has no gradient): a new layout
            self._layout = None
            weights, grads, names, loss_name, ops = self._current_layout(models)
            gradients = [p.list_grad()[0] for p in map(_alive, grads)]
        # the parameters' current arrays (a reinitialized parameter has new ones), on their first context
        tensors = [p.list_data()[0] for p in map(_alive, weights)] + gradients
        if loss_name is not None:
            tensors.append(loss[1] if loss is not None else None)
        if not any(t is not None for t in tensors):
            return None
        key = (trained, None if loss is None else (loss[1].shape, loss[1].dtype))
        op = ops.get(key)
        if op is None:  # (the first step, a mode without gradients, a last batch of another size)
            op = ops[key] = Statistics(
                [None if t is None else t.shape for t in tensors],
                [None if t is None else t.dtype for t in tensors],
            )
        self.monitor.track(names, loss_name, self._make_ring)
        slot = self.monitor.row()
        with autograd.pause():
            op(tensors, out=self._rows[slot])  # (straight into the ring's row)
        return slot, tensors, names, loss_name

    def _judge(self, judged: tuple, tensors: list | None, names: tuple) -> None:
        """Judge a recorded row; ``tensors``: the step's parameters, gradients and loss, still as the step
        left them (None for a row read late), saved with the step's block tensors, as far as the user's
        collections name them, when the row fires a trigger (the first non-finite value, a loss spike)."""
        slot, step, mode, mode_step, inputs, outputs, loss_name = judged
        if self._ring is None:
            return
        row = self._rows[slot].asnumpy()
        monitor = self.monitor
        triggers = len(monitor.triggers)
        if monitor.check(slot, row) or self._weights_only is not None:
            where = self._where(row, inputs, outputs, loss_name)
            record = {"step": step, "mode": mode.name, "mode_step": mode_step, **where}
            if where["direction"] != "weights":
                self._weights_only = None
                monitor.found(record)
            elif self._weights_only is None:
                # Only weights: set between two steps, or by this step's update. The weights of a step are
                # read after its update (smdebug 1.0's), so the first place the value shows among what a
                # step computes is the next step's forward pass: held until that step is judged.
                self._weights_only = {**record, "direction": "backward"}
            else:
                held, self._weights_only = self._weights_only, None
                monitor.found(held)
        # a trigger of this row, or one awaiting the step's end (training raised, a signal: the hook
        # closes, and this is its last step)
        if tensors is not None and (len(monitor.triggers) > triggers or monitor.pending):
            self._saved_step(step, names, tensors, inputs, outputs)
        elif tensors is not None:  # (a trigger may still come before the step ends: close)
            self._judged = (step, names, tensors, inputs, outputs)

    def _saved_step(self, step: int, names, tensors, inputs, outputs) -> None:
        self._judged = None
        with self.hook.guard("save the step's tensors"):
            self._save_step(zip(names, tensors))
            self._save_step(self._block_tensors(inputs, outputs))

    def _make_ring(self, rows: int, columns: int):
        weights = self._layout[1] if self._layout is not None else []
        ctx = _alive(weights[0]).list_ctx()[0] if weights else mx.cpu()
        self._ring = mx.nd.full((rows, columns), ABSENT, ctx=ctx, dtype="float32")
        self._late = reads_late(ctx)
        self._rows = [self._ring[i] for i in range(rows)]  # views of its rows (a view costs a call)
        return self._ring

    def _current_layout(self, models: list) -> tuple:
        """(weights, parameters with gradients (weak references), names, loss name, Statistics by the
        loss's shape), kept while the models and their parameters (the hook's lists) stay the same."""
        lists = [self.hook.parameter_refs(model) for model in models]
        loss_name = self.loss_blocks[0] + OUTPUT_SUFFIX + "0" if self.loss_blocks else None
        key = (tuple((id(refs), len(refs)) for refs in lists), loss_name)
        if self._layout is None or self._layout[0] != key:
            named = {}  # (a parameter two models share: once)
            for refs in lists:
                for ref, name, _ in refs:
                    if ref() is not None:
                        named.setdefault(name, ref)
            weights = list(named.values())
            grads = [ref for ref in weights if ref().grad_req != "null"]
            self._frozen = [ref for ref in weights if ref().grad_req == "null"]
            names = [ref().name for ref in weights] + [GRADIENT_PREFIX + ref().name for ref in grads]
            self._parameter_names = frozenset(names)
            names += [loss_name] if loss_name is not None else []
            self._layout = (key, weights, grads, tuple(names), loss_name, {})
        return self._layout[1:]

    # -- the first non-finite value --------------------------------------------------------------------
    def _where(self, row, inputs, outputs, loss_name) -> dict:
        """Where the step's first non-finite value appeared (see the module's docstring)."""
        for model, flags in inputs:
            for name, flag, _, _ in flags:
                if flag is not None and not np.isfinite(flag.asnumpy()).all():
                    return _where("input", model, name)
        for block, name, value in self._block_tensors((), outputs, OUTPUT_SUFFIX):
            if _nonfinite(value):
                return _where("forward", block, name)
        bad = self.monitor.nonfinite_names(row)
        if loss_name in bad:
            return _where("loss", loss_name[: -len(OUTPUT_SUFFIX + "0")], loss_name)
        grads = [n for n in bad if n.startswith(GRADIENT_PREFIX)]
        name = grads[-1] if grads else (bad[0] if bad else "")
        # ("weights": only weights were non-finite, see _judge)
        return _where(
            "backward" if grads else "weights", self._owner(name.removeprefix(GRADIENT_PREFIX)), name
        )

    def _owner(self, param_name: str) -> str:
        """The block whose own parameter this is."""
        found: list = []
        for model in (ref() for ref in self._models):
            if model is not None:
                model.apply(lambda b: found.append(b.name) if param_name in b.params.keys() else None)
        return found[0] if found else param_name

    def _block_tensors(self, inputs: list, outputs: list, only: str | None = None):
        """(block, tensor name, array) of the step's model inputs (their copies where kept) and its blocks'
        inputs and outputs (``only``: of this suffix), named as the hook names them, numbered per step."""
        copies = {}
        for model, flags in inputs:
            for name, _, value, kept in flags:
                if kept is not None:
                    copies[id(value)] = kept  # (a child's input that is the model's batch: the copy too)
                    yield model, name, kept
        counts: dict[str, int] = {}
        for block, block_inputs, values in outputs:
            for suffix, value in ((INPUT_SUFFIX, block_inputs), (OUTPUT_SUFFIX, values)):
                if value is None or only not in (None, suffix):
                    continue
                prefix = block + suffix
                for tensor in (value,) if isinstance(value, NodeOutput) else self.hook.tensors_in(value):
                    index = counts.get(prefix, 0)
                    counts[prefix] = index + 1
                    yield block, f"{prefix}{index}", copies.get(id(tensor), tensor)

    def _save_step(self, named) -> None:
        """The triggering step's tensors (``(name, array)`` or ``(block, name, array)``) the user's
        collections name, saved as those collections save (those the step saves anyway aside). Its
        parameters and gradients are saved here, due or not, and the step then saves none: the hook
        reads them when the next step starts (after a zero_grad), or, after a mode change, not at all
        (smdebug 1.0.34's rule: the last TRAIN step before an evaluation has none)."""
        hook = self.hook
        parameters = False
        for *_, name, tensor in named:
            if isinstance(tensor, NodeOutput):
                tensor = tensor.kept
            if tensor is None:  # (a gradient of an evaluation step, an output not kept)
                continue
            parameter = name in self._parameter_names
            if hook.is_due(name) and not parameter:
                continue
            collections = [c.name for c in hook.collections_of(name)]
            if collections:
                BaseHook.save_tensor(hook, name, tensor, collections)
                parameters = parameters or parameter
        if parameters:
            hook.params_saved_step = hook.step


def _alive(ref):
    """The Parameter of a weak reference (the hook keeps weak ones: smdebug_mxnet.hook.setup)."""
    param = ref()
    if param is None:
        raise ReferenceError("a parameter of the model was freed")
    return param


def reads_late(ctx) -> bool:
    """Whether a ring on this context is read a step late: on a GPU (a read would wait for the device)."""
    return ctx.device_type != "cpu"


def _where(direction: str, module: str, tensor: str) -> dict:
    return {"direction": direction, "module": module, "tensor": tensor}
