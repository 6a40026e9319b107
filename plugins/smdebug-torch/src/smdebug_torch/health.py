"""Always-on health for torch (``Hook(health=True)``): every step's statistics into the core's flight
recorder (smdebug.health), and where the first non-finite value came from.

Once a step, right before the optimizer applies the gradients (a global optimizer step pre-hook; until an
optimizer step is seen, at the end of the step's backward pass; else at the step's end), the l2 norm and the
max |x| of every parameter, every gradient and the loss are computed into the recorder's row, which lives on
the parameters' device. On the CPU, by the native kernel (smdebug_torch.native) once it is loaded: one call,
one reading of each tensor, no list of tensors made. Else in a few batched calls: tensors of one shape are
stacked into a buffer kept for them and reduced row-wise, the others packed or reduced alone; one copy puts
the results into the row. On the CPU the row is judged at once; on a GPU its host copy is made without waiting
and judged at the next step.

When a row holds the run's first non-finite value the step is examined, in the order it computed things:
the model's input batch, then a re-run of the forward pass (no gradients, the random state and the
buffers restored, every module's output checked; only while the parameters are still those of the step),
the model's output, the loss, then the gradients. Nothing of this runs on a healthy step. Non-finite
gradients that no optimizer step applied (GradScaler skips such a step by design, and each optimizer
whose own gradients are not finite) are the first non-finite value only if a later row shows they reached
the weights.
"""

from __future__ import annotations

import logging
import operator
import weakref
from contextlib import ExitStack
from typing import Any

import torch

from smdebug.plugin import INPUT_SUFFIX, OUTPUT_SUFFIX, ModeKeys
from smdebug_torch import native
from smdebug_torch.collection import GRADIENT_PREFIX
from smdebug_torch.hook import _registered
from smdebug_torch.sharded import sharded_modules

logger = logging.getLogger("smdebug")

_NONE = type(None)
# Every torch call costs microseconds on the CPU, so a step makes a few per group of tensors, none per
# tensor: tensors up to STACK_NUMEL elements are stacked with the others of their shape when they are at
# least STACK_MEMBERS; the other small ones (up to PAD_NUMEL) are packed, zero padded, into the rows of one
# matrix (zeros change neither an l2 norm nor a max |x|); one kernel per statistic reduces a stack or a pack.
# The large ones are reduced one by one (their reading costs more than a call).
STACK_NUMEL = 1 << 16
STACK_MEMBERS = 4
PAD_NUMEL = 1 << 14
PAD_SLACK = 1 << 16  # zeros a pack may hold beyond its values' count (reading them costs less than a call)
_FLOAT32_SOURCES = (torch.float32, torch.float16, torch.bfloat16)  # norms computed into float32 directly


def _nonfinite(t: Any) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and (t.is_floating_point() or t.is_complex())
        and not bool(torch.isfinite(t.detach()).all())
    )


def _groups(tensors: list) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """The indices of these tensors in stacks (one shape), in zero-padded packs and alone."""
    shapes: dict[Any, list[int]] = {}
    for i, t in enumerate(tensors):
        small = t.is_floating_point() and t.numel() <= STACK_NUMEL
        shapes.setdefault((t.device, t.dtype, tuple(t.shape)) if small else i, []).append(i)
    stacks: list[list[int]] = []
    small: dict[tuple, list[int]] = {}
    alone: list[int] = []
    for key, members in shapes.items():
        if isinstance(key, tuple) and len(members) >= STACK_MEMBERS:
            stacks.append(members)
        elif isinstance(key, tuple) and tensors[members[0]].numel() <= PAD_NUMEL:
            small.setdefault(key[:2], []).extend(members)
        else:
            alone.extend(members)
    packs: list[list[int]] = []
    for members in small.values():  # smallest first: a pack's width is its last member's size
        members.sort(key=lambda i: tensors[i].numel())
        pack: list[int] = []
        total = 0
        for i in members:
            numel = tensors[i].numel()
            if pack and (len(pack) + 1) * numel > 2 * (total + numel) + PAD_SLACK:
                packs.append(pack)
                pack, total = [], 0
            pack.append(i)
            total += numel
        packs.append(pack)
    alone += [p[0] for p in packs if len(p) == 1]
    return stacks, [p for p in packs if len(p) > 1], alone


def computing_order(tensors: list) -> list[int]:
    """The order in which a plan of these tensors computes their statistics: recorder columns in this
    order are written in place, without a scatter."""
    stacks, packs, alone = _groups(tensors)
    return [i for group in (*stacks, *packs) for i in group] + alone


def _norms_into(m: torch.Tensor, out: torch.Tensor, dim: int | None = 1) -> None:
    """The l2 norm of each row of ``m`` (of all of it: ``dim=None``) into ``out`` (float32)."""
    if m.dtype in _FLOAT32_SOURCES and m.device == out.device:
        torch.linalg.vector_norm(m, 2, dim=dim, dtype=torch.float32, out=out)
    else:
        out.copy_(torch.linalg.vector_norm(m, 2, dim=dim))


def _abs_max_into(m: torch.Tensor, out: torch.Tensor) -> None:
    """The max |x| of each row of ``m`` (a buffer of ours: made absolute in place) into ``out``."""
    m.abs_()
    if m.dtype == out.dtype and m.device == out.device:
        torch.amax(m, 1, out=out)
    else:
        out.copy_(m.amax(1))


class _Plan:
    """How one set of present tensors is reduced: stacks and packs (a buffer each) and large singles,
    their l2 norms and max |x| written through views made once into a vector of the plan's order, then
    copied into the recorder's row at once (scattered when the row's columns are in another order)."""

    def __init__(self, tensors: list[torch.Tensor], columns: list[int], width: int, row: torch.Tensor):
        stacks, packs, alone = _groups(tensors)
        order = [i for group in (*stacks, *packs) for i in group] + alone
        n = len(order)
        self.direct = n == width and all(columns[i] == k for k, i in enumerate(order))
        self.values = values = torch.empty(2 * n, dtype=row.dtype, device=row.device)
        self.columns = None
        if not self.direct:
            where = [columns[i] for i in order]
            self.columns = torch.tensor(
                where + [width + c for c in where], dtype=torch.long, device=row.device
            )
        self.partial = n < width
        # (pick, buffer, its [members, elements] view, l2 out, max out)
        self.stacks: list[tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        # (pick, the members' shapes, each member's place in the matrix (a view of the start of its row),
        # the matrix, l2 out, max out)
        self.packs: list[tuple[Any, list, list, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        start = 0
        for members in stacks:
            first, count = tensors[members[0]], len(members)
            buffer = torch.empty((count, *first.shape), dtype=first.dtype, device=first.device)
            outs = (values[start : start + count], values[n + start : n + start + count])
            self.stacks.append((_picker(members), buffer, buffer.view(count, -1), *outs))
            start += count
        for members in packs:
            first, count = tensors[members[0]], len(members)
            width_ = max(tensors[i].numel() for i in members)
            matrix = torch.zeros((count, width_), dtype=first.dtype, device=first.device)
            shapes = [tensors[i].shape for i in members]
            places = [matrix[r, : shape.numel()].view(shape) for r, shape in enumerate(shapes)]
            outs = (values[start : start + count], values[n + start : n + start + count])
            self.packs.append((_picker(members), shapes, places, matrix, *outs))
            start += count
        self.alone = _picker(alone) if alone else None
        self.alone_outs = [(values[k], values[n + k]) for k in range(start, n)]

    def fill(self, tensors: list[torch.Tensor], row: torch.Tensor) -> None:
        for pick, buffer, m, l2, top in self.stacks:
            torch.stack(pick(tensors), out=buffer)
            _norms_into(m, l2)
            _abs_max_into(m, top)
        for pick, shapes, places, matrix, l2, top in self.packs:
            members = list(pick(tensors))
            if list(map(_SHAPE, members)) != shapes:  # (a copy would broadcast some shapes silently)
                raise RuntimeError("the packed tensors' shapes changed")
            torch._foreach_copy_(places, members)  # one call (flatten + index_copy_ made two)
            _norms_into(matrix, l2)
            _abs_max_into(matrix, top)
        if self.alone is not None:  # large tensors: a call's cost is small beside their reading
            for t, (l2, top) in zip(self.alone(tensors), self.alone_outs):
                _norms_into(t, l2, dim=None)
                if t.dtype == top.dtype and t.device == top.device:
                    torch.amax(t.abs(), out=top)
                else:
                    top.copy_(t.abs().amax())
        if self.direct:
            row.copy_(self.values)
        else:
            if self.partial:
                row.fill_(-1.0)  # absent this step (smdebug.health.ABSENT)
            row.index_copy_(0, self.columns, self.values)


def _picker(indices: list[int]):
    """A list of the tensors at these indices (one C call)."""
    get = operator.itemgetter(*indices)
    return (lambda ts: [get(ts)]) if len(indices) == 1 else get


class TorchHealth:
    """The torch hook's part of health monitoring (``hook.health`` is the core's HealthMonitor)."""

    def __init__(self, hook):
        self.hook = hook
        self.monitor = hook.health
        self.rerunning = False
        self._collected = -1  # the step last recorded
        # (step, model, args, kwargs, autocast dtypes by device) of the step's first model call
        self._inputs: tuple | None = None
        self._outputs: tuple | None = None  # (step, model, outputs)
        self._loss: tuple | None = None  # (step, name, tensor) of the step's first loss call
        self._recorded_loss: str | None = None  # the name of a loss recorded by record_tensor_value
        self._layout: _Layout | None = None
        self._plans: dict[tuple, _Plan] = {}
        self._ring = None
        self._ring_host = None  # CPU: each slot's row, a numpy view made once
        self._row_at: list = []  # CPU: each slot's row's address (the native kernel fills it there)
        self._native_ok = True  # the native kernel may compute the rows (once loaded)
        self._rows: tuple = ()
        self._lagged: tuple | None = None  # GPU: (slot, host row, event) judged at the next step
        self._pinned: list | None = None  # GPU: two host rows the copies alternate between
        # Gradients are judged as the optimizer is about to apply them. Until an optimizer step is seen
        # (a manual update, or a GradScaler skipping its first steps), a step is recorded at the end of
        # its backward pass instead, and judged when the step ends unless the optimizer comes.
        self._optimizer_seen = False
        self._backward_watched = -1  # the step whose backward pass is watched
        self._unjudged: tuple | None = None  # (step, slot, tensors, names) recorded at a backward's end
        self._optimized: tuple | None = None  # (step, slot) of the row an optimizer step recorded
        # Non-finite gradients that no optimizer applied when they were seen (GradScaler skips such a
        # step by design): their provenance, found only if a later row shows they reached the weights
        self._deferred: dict | None = None
        self._last_row: tuple | None = None  # (step, mode, mode step, fresh) of the row judged last
        self._handles: list = []
        # optimizer -> (the models' parameter lists, its parameter count, its parameters' ids or None: _held)
        self._optimizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        import torch.optim.optimizer as optimizer

        self._handles.append(optimizer.register_optimizer_step_pre_hook(self._on_optimizer_step))

    # -- what the hook tells it ------------------------------------------------------------------------
    def watch_model(self, starter: torch.nn.Module) -> None:
        self._handles.append(starter.register_forward_pre_hook(self._on_model_inputs, with_kwargs=True))
        self._handles.append(starter.register_forward_hook(self._on_model_outputs))

    def watch_loss(self, loss_module: torch.nn.Module) -> None:
        self._handles.append(loss_module.register_forward_hook(self._on_loss_output))

    def close(self) -> None:
        self.step_ending()
        self._judge_lagged()
        deferred, self._deferred = self._deferred, None
        if deferred is not None and self.monitor.first_nonfinite is None and self._layout is not None:
            with self.hook.guard("find where the first non-finite value came from"):
                if any(map(_nonfinite, self._layout.weights)):  # the last step's update applied them
                    self.monitor.found(deferred)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _on_model_inputs(self, module, args, kwargs) -> None:
        if not self.rerunning and (self._inputs is None or self._inputs[0] != self.hook.step):
            self._inputs = (self.hook.step, module, args, kwargs, _autocast_state())

    def _on_model_outputs(self, module, inputs, outputs) -> None:
        step = self.hook.step
        if not self.rerunning and (self._outputs is None or self._outputs[0] != step):
            self._outputs = (step, module, outputs)
            if not self._optimizer_seen and self._backward_watched != step and torch.is_grad_enabled():
                self._watch_backward(outputs)
            if self.hook.mode in _UNTRAINED and not self._loss_follows():
                self.step_ending()  # judged now, while the script is still on this batch

    def _watch_backward(self, outputs) -> None:
        """No optimizer step seen yet: record the step at the end of its backward pass through the
        model's output, while the gradients are there and the parameters still those of the forward."""
        if _is_compiling():
            return
        for t in self.hook.tensors_in(outputs):
            if t.requires_grad and t.grad_fn is not None:
                t.grad_fn.register_prehook(self._on_backward_start)
                self._backward_watched = self.hook.step
                return

    def _on_backward_start(self, grad_outputs) -> None:
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
        except RuntimeError:  # not inside the engine's backward pass
            pass

    def _on_backward_end(self) -> None:
        hook = self.hook
        if not self._optimizer_seen and hook.in_step and not hook.closed:
            with hook.guard("record the step's health"):
                self.collect(rerun_safe=True, applied=False, backward_end=True)

    def _on_loss_output(self, module, inputs, output) -> None:
        if self._loss is None or self._loss[0] != self.hook.step:
            if isinstance(output, torch.Tensor):
                name = self.hook._module_names.get(module) or module._get_name()
                self._loss = (self.hook.step, f"{name}_output_0", output)
                if self.hook.mode is ModeKeys.EVAL:
                    self.step_ending()  # judged now, while the script is still on this batch

    def _loss_follows(self) -> bool:
        """Whether an evaluation step's loss comes after the model's output (a loss module, or a recorded
        loss): the step is judged with it."""
        return self.hook.mode is ModeKeys.EVAL and bool(self.hook._loss_modules or self._recorded_loss)

    def note_loss(self, name: str, loss: torch.Tensor) -> None:
        """A loss the script recorded itself (``record_tensor_value`` into the losses collection, no loss
        module registered): the step's loss, watched as a registered loss module's output is."""
        if loss.numel() == 1 and (self._loss is None or self._loss[0] != self.hook.step):
            self._loss = (self.hook.step, name, loss)
            self._recorded_loss = name
            if self.hook.mode is ModeKeys.EVAL:
                self.step_ending()

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        # the gradients are final and the parameters still those of the step's forward pass
        held = None if self.hook.closed else self._held(optimizer)
        if held is None:
            return
        self._optimizer_seen = True
        if self.hook.in_step:
            with self.hook.guard("record the step's health"):
                self.collect(rerun_safe=True, applied=held)

    def _held(self, optimizer) -> frozenset | None:
        """The ids of the optimizer's parameters if it updates one of a registered model's, else None: the
        pre-hook is global, and another model's optimizer (an unregistered model trained beside it)
        neither applies these gradients nor may record this model's step again."""
        models = self.hook._models.values()  # (refreshed by the step's forward pass, which came first)
        key = tuple(id(m.params) for m in models)
        groups = optimizer.param_groups
        count = sum(len(group["params"]) for group in groups)
        known = self._optimizers.get(optimizer)
        if known is not None and known[0] == key and known[1] == count:
            return known[2]
        ours = {id(p) for m in models for _, p in m.params + m.sharded}
        held = frozenset(id(p) for group in groups for p in group["params"])
        found = held if not ours.isdisjoint(held) else None
        self._optimizers[optimizer] = (key, count, found)
        return found

    def step_ending(self) -> None:
        """The step ends: record it if no optimizer step did."""
        hook = self.hook
        if hook.in_step and not hook.closed and (self._collected != hook.step or self._unjudged):
            with hook.guard("record the step's health"):
                # no optimizer step in this step: the parameters are still those of its forward pass in
                # evaluation, and in a run whose optimizer updates them (gradient accumulation, a step a
                # GradScaler skipped); a script's own update may have changed them
                safe = self._optimizer_seen or hook.mode in _UNTRAINED
                self.collect(rerun_safe=safe, applied=False)

    # -- every step ------------------------------------------------------------------------------------
    def collect(self, rerun_safe: bool, applied: frozenset | bool, backward_end: bool = False) -> None:
        """Record the step (``applied``: an optimizer is about to apply its gradients: the ids of its
        parameters) and judge it; at the end of a backward pass, record it only, to judge when the
        optimizer comes or the step ends."""
        hook = self.hook
        slot = None
        if self._collected == hook.step:
            unjudged, self._unjudged = self._unjudged, None
            if unjudged is None or unjudged[0] != hook.step:
                optimized = self._optimized
                if not (applied and optimized is not None and optimized[0] == hook.step):
                    return
                # another optimizer of the step (one per part of the model, a GAN's two): its gradients
                # are final only now; recorded again into the row, with the updates made so far
                slot, rerun_safe = optimized[1], False
            else:
                if not (applied or backward_end):  # the step ends without an optimizer step
                    self._judge(*unjudged[1:], rerun_safe=False, applied=False, fresh=True)
                    return
                slot = unjudged[1]  # recorded again into the same row: the gradients as they are now
        elif not hook._models:
            return
        else:
            self._collected = hook.step
            if self._lagged is not None:
                self._judge_lagged()
        layout = self._current_layout()
        untrained = hook.mode in _UNTRAINED  # no backward pass: its gradients are the last training step's
        loss = self._loss[2] if self._loss is not None and self._loss[0] == hook.step else None
        ring = self._ring
        if self.monitor.names is not layout.columns_names or self.monitor.buffer is not ring:
            ring = self.monitor.track(layout.columns_names, layout.loss_name, self._make_ring)
        if ring is not self._ring:
            self._ring, self._plans = ring, {}
            self._ring_host = list(ring.numpy()) if ring.device.type == "cpu" else None
            self._rows = ring.unbind(0)  # each slot's row, a view made once
            self._row_at = [r.data_ptr() for r in self._rows] if self._ring_host is not None else []
            slot = None
            if self._ring_host is not None:
                native.start()  # built (once per machine) or loaded, in the background
        watch = layout.watch if self._native_ok and self._ring_host is not None else None
        if watch is None:
            watch = self._native_watch(layout)
        tensors = present = finite = None  # (finite: every value of the row is, as the kernel found)
        if watch is None:  # (with one, a row always has the weights)
            tensors = _tensors_of(layout, loss, untrained)
            if _NONE in set(map(type, tensors)):  # (not `None in`: that compares each tensor with None)
                present = tuple(i for i, t in enumerate(tensors) if t is not None)
                if not present:
                    return
        if slot is None:
            slot = self.monitor.row()
        if applied:
            self._optimized = (hook.step, slot)
        row = self._rows[slot]
        if watch is not None:  # (the kernel's torch calls, for a dtype it does not read, record no graph)
            try:
                finite = watch.fill_at(loss, not untrained, row, self._row_at[slot])
            except Exception as exc:  # (a tensor it cannot read): torch's calls from now on
                self._native_ok = False
                logger.info("smdebug: health statistics computed by torch's batched calls: %s", exc)
                watch = None
        if watch is None:
            if tensors is None:
                tensors = _tensors_of(layout, loss, untrained)
            grad_mode = torch.is_grad_enabled()
            _set_grad_enabled(False)  # (torch.no_grad's Python costs several µs in a step, its code cold)
            try:
                self._fill_by_plan(layout, tensors, present, row)
            finally:
                _set_grad_enabled(grad_mode)
        names = layout.names
        if backward_end:
            if tensors is None:  # (judged later in the step: the gradients as they are now)
                tensors = _tensors_of(layout, loss, untrained)
            self._unjudged = (hook.step, slot, tensors, names)
            host = self._ring_host
            bad = self.monitor.nonfinite_names(host[slot]) if host is not None and not finite else []
            if bad and not _gradients_only(bad):
                # a non-finite input, weight or loss: judged now, while a re-run of the forward is safe
                self._unjudged = None
                self._judge(slot, tensors, names, rerun_safe=True, applied=False, fresh=True)
            return
        self._judge(slot, tensors, names, rerun_safe, applied, fresh=rerun_safe, finite=finite)

    def _native_watch(self, layout: _Layout):
        """The native kernel's watch of the layout's tensors (smdebug_torch.native): a CPU recorder's
        whole row in one call, once the kernel is loaded; else None (torch's batched calls fill it)."""
        if self._ring_host is None or not self._native_ok or not layout.weights:
            return None
        watch = layout.watch
        if watch is None:
            try:
                watch = layout.watch = native.health_watch(layout.weights, layout.grad_params, layout.columns)
            except Exception as exc:  # (a parameter it cannot hold)
                self._native_ok = False
                logger.info("smdebug: health statistics computed by torch's batched calls: %s", exc)
        return watch

    def _fill_by_plan(self, layout: _Layout, tensors: list, present: tuple | None, row: torch.Tensor) -> None:
        """The row by torch's batched calls, planned once for the tensors present."""
        plan_key = (layout.key, present)
        plan = self._plans.get(plan_key)
        chosen = tensors if present is None else [tensors[i] for i in present]
        if plan is None:
            plan = self._plans[plan_key] = self._plan(layout, chosen, present, row)
        try:
            plan.fill(chosen, row)
        except RuntimeError:  # shapes, dtypes or devices changed: plan again
            plan = self._plans[plan_key] = self._plan(layout, chosen, present, row)
            plan.fill(chosen, row)

    def _judge(
        self,
        slot: int,
        tensors: list | None,
        names: tuple,
        rerun_safe: bool,
        applied: frozenset | bool,
        fresh: bool,
        finite: bool | None = None,
    ) -> None:
        """Judge a recorded row (``fresh``: its weights are those of the step's forward pass, not yet
        updated; ``applied``: an optimizer is about to apply its gradients (its parameters' ids, else
        False); ``tensors``: the row's, None when no list of them was made: the step's current ones;
        ``finite``: whether its every value is, if known)."""
        hook = self.hook
        ring = self._ring
        if self._ring_host is not None or hook.anything_due():  # (a GPU's save step: waited for)
            row = self._ring_host[slot] if self._ring_host is not None else ring[slot].cpu().numpy()
            triggers = len(self.monitor.triggers)
            last, self._last_row = self._last_row, (hook.step, hook.mode, hook.mode_step, fresh)
            if self.monitor.check(slot, row, finite=finite):
                if not self._wait(row, applied, self._last_row, last):
                    self._first_nonfinite(row, rerun_safe, tensors, names)
                elif len(self.monitor.triggers) > triggers:  # the waiting row was confirmed
                    with hook.guard("save the step's tensors"):
                        self._save_step(tensors, names, rerun_safe)
            elif hook.mode in _UNTRAINED and self._outputs_nonfinite():
                # no gradient or loss carries an evaluation's bad output into the row: its own check
                self._first_nonfinite(row, rerun_safe, tensors, names)
            else:
                self._deferred = None  # (finite: the waiting gradients went nowhere)
                if len(self.monitor.triggers) > triggers:  # a loss spike
                    with hook.guard("save the step's tensors"):
                        self._save_step(tensors, names, rerun_safe)
        else:
            if self._pinned is None or self._pinned[0].shape[0] != ring.shape[1]:
                pin = ring.device.type == "cuda"
                self._pinned = [torch.empty(ring.shape[1], pin_memory=pin) for _ in range(2)]
            host = self._pinned[hook.step % 2]  # the other one may still be judged
            host.copy_(ring[slot], non_blocking=True)
            event = torch.cuda.Event() if ring.device.type == "cuda" else None
            if event is not None:
                event.record()
            self._lagged = (slot, host, event, (hook.step, hook.mode, hook.mode_step, fresh), applied)

    def _outputs_nonfinite(self) -> bool:
        """Whether the model's output of this step holds a non-finite value (none found yet)."""
        outputs = self._outputs
        if outputs is None or outputs[0] != self.hook.step or self.monitor.first_nonfinite is not None:
            return False
        return any(map(_nonfinite, self.hook.tensors_in(outputs[2])))

    def _judge_lagged(self) -> None:
        """GPU: judge the row whose host copy the last step started."""
        lagged, self._lagged = self._lagged, None
        if lagged is None:
            return
        slot, host, event, this, applied = lagged
        if event is not None:
            event.synchronize()
        row = host.numpy()
        last, self._last_row = self._last_row, this
        if self.monitor.check(slot, row):
            if not self._wait(row, applied, this, last):
                step, mode, mode_step, _ = this
                bad = self.monitor.nonfinite_names(row)
                where = self._from_names(bad)
                self.monitor.found({"step": step, "mode": mode.name, "mode_step": mode_step, **where})
        else:
            self._deferred = None

    def _wait(self, row, applied: frozenset | bool, this: tuple, last: tuple | None) -> bool:
        """A row holds non-finite values, none found yet: True when they are not judged as the first,
        for now (gradients no optimizer applied: a GradScaler skips such a step) or because they confirm
        the waiting row (its gradients reached the weights, or an optimizer applied them accumulated), or
        name the training step whose update (the script's own: no optimizer step seen) wrote them.
        ``this`` and ``last``: (step, mode, mode step, fresh) of this row and of the one before."""
        bad = self.monitor.nonfinite_names(row)
        gradients_only = _gradients_only(bad)
        if applied and gradients_only:  # applied only if the optimizer stepping holds one of them (a
            # GradScaler skips each optimizer whose own gradients are not finite, the others step)
            applied = self._applies(applied, bad)
        deferred = self._deferred
        weights = self._layout.weight_names
        bad_weights = [name for name in bad if name in weights]
        if deferred is None and bad_weights and not self._optimizer_seen:
            # updated weights (recorded at the step's end): this step's update; else, if the last
            # step's were finite before its update, that one
            update = this if not this[3] else last if last is not None and last[3] else None
            if update is not None and update[1] in _TRAINING:
                name = min(bad_weights, key=self._layout.position.__getitem__)
                gradient = GRADIENT_PREFIX + name
                tensor = gradient if gradient in self._layout.position else name
                where = _where("backward", self._owner(name), tensor)
                self.monitor.found(
                    {"step": update[0], "mode": update[1].name, "mode_step": update[2], **where}
                )
                return True
        if deferred is not None:
            if (applied and gradients_only) or bad_weights:
                self._deferred = None
                self.monitor.found(deferred)
                return True
            if gradients_only:
                return True
            self._deferred = None  # its gradients went nowhere: this row is judged on its own
        if gradients_only and not applied:
            where = self._from_names(bad)
            self._deferred = {"step": this[0], "mode": this[1].name, "mode_step": this[2], **where}
            return True
        return False

    def _applies(self, held: frozenset, gradients: list[str]) -> bool:
        """Whether the optimizer holding the parameters ``held`` (ids) applies one of these non-finite
        gradients. By name, and by value where it is still there: two registered models of one class
        share their tensors' names, and the other's gradient of that name may be finite."""
        layout = self._layout
        params = layout.grad_params
        first = len(layout.weights)
        bad = set(gradients)
        return any(
            id(p) in held and (p.grad is None or _nonfinite(p.grad))  # (None: zeroed since it was recorded)
            for name, p in zip(layout.names[first : first + len(params)], params)
            if name in bad
        )

    def _make_ring(self, rows: int, columns: int) -> torch.Tensor:
        device = torch.device("cpu")
        for model in self.hook._models.values():
            for _, p in model.params[:1]:
                device = p.device if p.device.type != "meta" else device
        return torch.full((rows, columns), -1.0, dtype=torch.float32, device=device)

    @staticmethod
    def _plan(layout: _Layout, chosen: list, present: tuple | None, row: torch.Tensor) -> _Plan:
        columns = layout.columns if present is None else [layout.columns[i] for i in present]
        return _Plan(chosen, columns, len(layout.names), row)

    def _current_layout(self) -> _Layout:
        hook = self.hook
        layout = self._layout
        losses = hook._loss_modules
        source = losses[0] if losses else self._recorded_loss
        # the common step: no parameter or module registered, no model refreshed, the same loss (less to
        # run than the key below: a step runs this with its caches cold)
        if (
            layout is not None
            and layout.seen == (_registered[0], sharded_modules())
            and layout.source is source
            and layout.params == list(map(_PARAMS, hook._models.values()))
            and not (layout.frozen and any(map(_REQUIRES_GRAD, layout.frozen)))
        ):
            return layout
        models = list(hook._models.values())
        for model in models:
            if model.stale():
                hook._refresh(model)
        loss_name = self._recorded_loss
        if hook._loss_modules:
            first = hook._loss_modules[0]
            loss_name = f"{hook._module_names.get(first) or first._get_name()}_output_0"
        key = (tuple(id(m.params) for m in models), loss_name)
        # (a frozen parameter made trainable again, as fine-tuning does: its gradient is watched from now)
        if layout is None or layout.key != key or layout.frozen and any(map(_REQUIRES_GRAD, layout.frozen)):
            self._layout = layout = _Layout(key, models, loss_name)
            self._plans = {}
        lazy = any(model.lazy for model in models)  # (stale until initialised: looked at every step)
        layout.seen = None if lazy else (_registered[0], sharded_modules())
        layout.source = source
        layout.params = [model.params for model in models]
        return layout

    # -- the first non-finite value --------------------------------------------------------------------
    def _first_nonfinite(self, row, rerun_safe: bool, tensors: list | None, names: tuple) -> None:
        hook = self.hook
        bad = self.monitor.nonfinite_names(row)
        where = None
        with hook.guard("find where the first non-finite value came from"):
            where = self._examine(bad, rerun_safe)
        if where is None:
            where = self._from_names(bad)
        elif where["direction"] == "forward":  # the module's own weights, bad as the step began (an update)?
            loss = self._layout.loss_name
            weights = [n for n in bad if n != loss and not n.startswith("gradient/")]
            params = [n for n in weights if self._owner(n) == where["module"]]
            if params:
                where["parameters"] = params
        self.monitor.found({"step": hook.step, "mode": hook.mode.name, "mode_step": hook.mode_step, **where})
        with hook.guard("save the step's tensors"):
            self._save_step(tensors, names, rerun_safe)

    def _examine(self, bad: list[str], rerun_safe: bool) -> dict | None:
        hook = self.hook
        step = hook.step
        inputs = self._inputs if self._inputs is not None and self._inputs[0] == step else None
        if inputs is not None:
            _, starter, args, kwargs, autocast = inputs
            name = hook._models[starter].name
            for i, t in enumerate(hook.tensors_in((args, kwargs))):
                if _nonfinite(t):
                    return _where("input", name, f"{name}_input_{i}")
            if rerun_safe:
                found = self._rerun(starter, args, kwargs, autocast)
                if found is not None:
                    return _where("forward", *found)
        outputs = self._outputs if self._outputs is not None and self._outputs[0] == step else None
        if outputs is not None:
            name = hook._models[outputs[1]].name
            for i, t in enumerate(hook.tensors_in(outputs[2])):
                if _nonfinite(t):
                    return _where("forward", name, f"{name}_output_{i}")
        return None

    def _from_names(self, bad: list[str]) -> dict:
        """Where, from the recorded row alone: the loss, else the gradient nearest the output (the backward
        pass meets it first), else a weight."""
        loss_name = self._layout.loss_name
        bad = sorted(bad, key=self._layout.position.__getitem__)  # the model's order, not the columns'
        if loss_name in bad:
            return _where("loss", loss_name[: -len("_output_0")], loss_name)
        grads = [n for n in bad if n.startswith("gradient/")]
        if grads:
            name = grads[-1]
            return _where("backward", self._owner(name[len("gradient/") :]), name)
        name = bad[0] if bad else ""
        return _where("backward", self._owner(name), name)

    def _owner(self, param_name: str) -> str:
        """The module holding a parameter named ``<Model>_<path>``, by the hook's module names."""
        for model in self.hook._models.values():
            prefix = model.name + "_"
            if param_name.startswith(prefix):
                path = param_name[len(prefix) :]
                return path.rsplit(".", 1)[0] if "." in path else model.name
        return param_name

    def _rerun(self, starter: torch.nn.Module, args, kwargs, autocast: dict) -> tuple[str, str] | None:
        """Run the step's forward pass again, every module's output checked: the first module that
        returns a non-finite value from finite inputs (its name and its output's tensor name)."""
        hook = self.hook
        found: list[tuple[str, str]] = []
        counts: dict[str, int] = {}

        def check(name, inputs, outputs):
            if found:
                return
            outs = list(hook.tensors_in(outputs))
            index = counts.get(name, 0)
            counts[name] = index + len(outs)
            bad = [i for i, t in enumerate(outs) if _nonfinite(t)]
            if bad and not any(_nonfinite(t) for t in hook.tensors_in(inputs)):
                found.append((name, f"{name}_output_{index + bad[0]}"))

        self._forward_again(starter, args, kwargs, autocast, check)
        return found[0] if found else None

    def _forward_again(self, starter: torch.nn.Module, args, kwargs, autocast: dict, on_output) -> None:
        """Run the step's forward pass again (no gradients, the random state and the buffers restored,
        under the step's autocast: a float16 overflow happens only there),
        ``on_output(module name, inputs, outputs)`` called as each named module returns."""
        hook = self.hook
        module = hook._models[starter].module
        if type(module).__name__ == "DistributedDataParallel":
            module = module.module  # its forward may broadcast buffers: a collective only this rank enters
        if hook._models[starter].sharded or any(map(_syncs_ranks, module.modules())):
            # its forward pass runs collectives the other ranks would not enter (FSDP gathers parameters,
            # tensor parallel layers reduce their outputs, SyncBatchNorm its statistics): not here
            return
        names = hook._module_names

        def called(mod, inputs, outputs):
            name = names.get(mod)
            if name is not None:
                on_output(name, inputs, outputs)

        handles = [m.register_forward_hook(called) for m in module.modules()]
        buffers = [(b, b.detach().clone()) for b in module.buffers()]
        devices = sorted({b.device.index or 0 for b, _ in buffers if b.device.type == "cuda"})
        devices += sorted({p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"})
        self.rerunning = True
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=sorted(set(devices))), ExitStack() as stack:
                for device in _AUTOCAST_DEVICES:
                    dtype = autocast.get(device)
                    stack.enter_context(torch.autocast(device, dtype=dtype, enabled=dtype is not None))
                module(*args, **kwargs)
        except Exception:  # the first failure may be what the step did too: nothing more to learn
            pass
        finally:
            self.rerunning = False
            for handle in handles:
                handle.remove()
            with torch.no_grad():
                for buffer, saved in buffers:
                    buffer.copy_(saved)

    def _save_layers(self) -> None:
        """The step's module inputs and outputs the user's collections name (gone once its forward
        pass returned): saved from a re-run of that pass."""
        hook = self.hook
        inputs = self._inputs
        if inputs is None or inputs[0] != hook.step or hook.anything_due():  # (a save step saved them)
            return
        if not any(map(hook.layer_wanted, set(hook._module_names.values()))):
            return

        def save(name, inputs, outputs):
            for suffix, values in ((INPUT_SUFFIX, inputs), (OUTPUT_SUFFIX, outputs)):
                for tensor_name, value in hook.numbered_tensors(name + suffix, values):
                    collections = [c.name for c in hook.collections_of(tensor_name)]
                    if collections:
                        hook.save_tensor(tensor_name, value, collections)

        self._forward_again(*inputs[1:], save)

    def _save_step(self, tensors: list | None, names: tuple, rerun_safe: bool) -> None:
        """The triggering step's tensors the user's collections name, saved as those collections save
        (its layers' inputs and outputs when a re-run of its forward pass is safe)."""
        hook = self.hook
        if rerun_safe:
            self._save_layers()
        if tensors is None:  # (the native kernel made no list of them) those of the step, as they are
            loss = self._loss[2] if self._loss is not None and self._loss[0] == hook.step else None
            tensors = _tensors_of(self._layout, loss, hook.mode in _UNTRAINED)
        for name, tensor in zip(names, tensors):
            if tensor is None or hook.is_due(name):
                continue  # saved by the step already
            collections = [c.name for c in hook.collections_of(name)]
            if collections:
                hook.save_tensor(name, tensor.detach(), collections)
        # A sharded tensor's capture needs every rank in one collective, and a trigger may fire on one
        # rank alone: recorded, not saved (a save step saves them as usual).
        sharded = [n for m in hook._models.values() for n, _ in (*m.sharded, *m.sharded_grads)]
        left = [name for name in sharded if not hook.is_due(name) and hook.collections_of(name)]
        for name in left:
            hook.record_unsaved_tensor(name, _SHARDED_AT_TRIGGER)
        if left:
            hook.warn_once("health:sharded", "smdebug: %s (%s...)", _SHARDED_AT_TRIGGER, left[0])


_SHARDED_AT_TRIGGER = "a sharded tensor is not saved at a health trigger's step (it needs every rank)"
_GRAD = operator.attrgetter("grad")
_PARAMS = operator.attrgetter("params")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
_TRAINING = (ModeKeys.TRAIN, ModeKeys.GLOBAL)
_UNTRAINED = (ModeKeys.EVAL, ModeKeys.PREDICT)
_is_compiling = getattr(torch.compiler, "is_compiling", None) or (lambda: False)
_AUTOCAST_DEVICES = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def _autocast_state() -> dict:
    """The autocast dtype of each device where autocast is on now."""
    if _any_autocast is not None and not _any_autocast():  # (one call, every step: a fourth of the others)
        return {}
    return {d: torch.get_autocast_dtype(d) for d in _AUTOCAST_DEVICES if torch.is_autocast_enabled(d)}


_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)


def _syncs_ranks(module: torch.nn.Module) -> bool:
    """A module whose forward pass runs collectives: classic FSDP, FSDP2, SyncBatchNorm."""
    kind = type(module).__name__
    return "FullyShard" in kind or "FSDP" in kind or kind == "SyncBatchNorm"


def _gradients_only(names: list[str]) -> bool:
    """Whether these non-finite tensors are all gradients (none: False)."""
    return bool(names) and all(name.startswith(GRADIENT_PREFIX) for name in names)


_set_grad_enabled = torch._C._set_grad_enabled
_SHAPE = operator.attrgetter("shape")


class _Layout:
    """The tensors health watches, in the model's order (weights, gradients, the loss), and the
    recorder's columns of them: in the order a plan computes them, so that a step writes its row in place."""

    def __init__(self, key: tuple, models: list, loss_name: str | None):
        params = [(n, p) for m in models for n, p in m.params if isinstance(p, torch.Tensor)]
        params = [(n, p) for n, p in params if not isinstance(p, torch.nn.parameter.UninitializedParameter)]
        grads = [(g, p) for m in models for g, p in m.gradients if p.requires_grad]
        self.frozen = [p for m in models for _, p in m.gradients if not p.requires_grad]
        self.key = key
        self.loss_name = loss_name
        self.weights = [p for _, p in params]
        self.weight_names = frozenset(n for n, _ in params)
        self.grad_params = [p for _, p in grads]
        names = [n for n, _ in params] + [g for g, _ in grads] + ([loss_name] if loss_name else [])
        self.names = tuple(names)
        self.position = {name: i for i, name in enumerate(names)}
        # a gradient is planned like its parameter, the loss like any scalar
        device = self.weights[0].device if self.weights else None
        like = self.weights + self.grad_params + ([torch.zeros((), device=device)] if loss_name else [])
        order = computing_order(like) if all(isinstance(t, torch.Tensor) for t in like) else range(len(like))
        self.columns = [0] * len(names)
        for column, i in enumerate(order):
            self.columns[i] = column
        self.columns_names = tuple(names[i] for i in order)
        self.watch = None  # the native kernel's watch of these tensors (smdebug_torch.native)
        # what it was last found current with (TorchHealth._current_layout)
        self.seen: tuple | None = None
        self.source: Any = None
        self.params: list = []


def _tensors_of(layout: _Layout, loss: torch.Tensor | None, untrained: bool) -> list:
    """A step's tensors in the layout's order: the weights, their gradients (none in evaluation: no
    backward pass, those there are the last training step's), the loss."""
    grads = [None] * len(layout.grad_params) if untrained else list(map(_GRAD, layout.grad_params))
    tensors = layout.weights + grads
    if layout.loss_name is not None:
        tensors.append(loss)
    return tensors


def _where(direction: str, module: str, tensor: str) -> dict:
    return {"direction": direction, "module": module, "tensor": tensor}
