"""Capturing tensors (a part of BaseHook): saving what the framework shows when it is due, what a
plugin computed itself (a sharded tensor's), numbered outputs, values saved outside a step, and the
run's notes of tensors placed as shards or not captured; each goes to the reductions or the writer."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from smdebug import codec, plugins
from smdebug.collection import Collection
from smdebug.exceptions import SMDebugTypeError
from smdebug.hook_helpers import NESTED, leaves
from smdebug.reductions import reduction_tensor_name
from smdebug.writing.settings import RESERVE_BYTES

_BULK_PLANS = 64  # save_many_for_step's plans kept (a plugin passes the same few name tuples each step)


class HookCapture:
    """BaseHook's capture of tensors; it uses the hook's plans, reductions and writer."""

    # save_computed's last (tensors and their reductions, the lists of their reduction names)
    _computed: tuple[list, list[list[str]]] = ([], [])

    def save_for_step(self, name: str, value: Any) -> bool:
        """Save a tensor seen by the framework if one of its collections is due now; True if saved.
        The name is recorded in its collections, so the run's collections file lists it."""
        if not (self._in_step and self._due and self.writing):
            return False
        plan = self._due_plan(name, value)
        if plan is None:
            return False
        pairs, names, raw, shape, histogram = plan
        # reductions only, in a together() block: what _reduce_all does, inline
        if self._gathered is not None and pairs and not (raw or shape or histogram):
            self._gathered.append((name, value, pairs, names))
        else:
            self._write_planned(name, value, plan)
        return True

    def save_many_for_step(self, names: Sequence[str], values: Sequence[Any]) -> None:
        """save_for_step of each of these numeric tensors (a model's parameters or gradients, at every
        step), their reductions started in one plugin call. Planned once for the same ``names`` object (a
        tuple the plugin keeps) while the due collections and the collections stay the same: a step then
        makes no Python call per tensor, and its reduction names reach the writer as the same lists."""
        if not (self._in_step and self._due and self.writing):
            return
        due = self._due
        bulk = self._bulk_plans.get(id(names))
        if bulk is None or bulk[0] is not names or bulk[1] is not due or bulk[2] != self.collections_version:
            if len(self._bulk_plans) >= _BULK_PLANS:
                self._bulk_plans.clear()
            bulk = (names, due, self.collections_version, self._bulk_plan(names, values))
            self._bulk_plans[id(names)] = bulk  # holding names keeps its id unique
        plan = bulk[3]
        if plan is None:  # not all due, some saved raw, or different reductions: one by one
            with self.together():
                for name, value in zip(names, values):
                    self.save_for_step(name, value)
            return
        pairs, reduction_names = plan
        values = values if isinstance(values, list) else list(values)
        self._take_started(names, values, pairs, plugins.reductions(values, list(pairs)), reduction_names)

    def _bulk_plan(self, names: Sequence[str], values: Sequence[Any]) -> tuple | None:
        """(reduction pairs, each tensor's reduction names) when every tensor is due for the same
        reductions only, else None."""
        plans = [self._due_plan(name, value) for name, value in zip(names, values)]
        if not plans or any(p is None or p[2] or p[3] or p[4] or not p[0] for p in plans):
            return None
        pairs = plans[0][0]
        if any(p[0] != pairs for p in plans):
            return None
        return pairs, [p[1] for p in plans]

    # -- tensors a plugin computes itself (a sharded tensor: its workers compute it together) ------
    def save_computed(
        self,
        values: Mapping[str, Any] | None = None,
        reductions: Mapping[str, Mapping[tuple[str, bool], np.generic]] | None = None,
    ) -> None:
        """Save what the plugin computed itself for tensors due now (plan_for): values by tensor name,
        and reductions by tensor name, ``{(reduction, abs): numpy scalar}`` (written together). Nothing on
        a worker that does not write."""
        if not (self._in_step and self.writing):
            return
        for name, value in (values or {}).items():
            self._write_planned(name, value, ((), [], True, False, False))
        found = [(name, results) for name, results in (reductions or {}).items() if results]
        if not found:
            return
        key = [(name, tuple(results)) for name, results in found]
        if key != self._computed[0]:
            names = [[reduction_tensor_name(name, r, a) for r, a in results] for name, results in found]
            self._computed = (key, names)
        # the same tensors and reductions as the last time (every step, for a plugin): the same lists,
        # which the writer knows (they cross to a writer process by number, and encode from a template)
        names = self._computed[1]
        rows = [np.array(list(results.values())) for _, results in found]
        with self.guard("save reductions"):
            self._write_reductions(names, rows)

    def record_placement(self, name: str, placement: Mapping[str, Any]) -> None:
        """Record where this worker's saved value of ``name`` lies in the full tensor it is a shard of
        (global_shape, offsets, local_shape, mesh_shape, coordinate, placements): the Trial assembles
        the full tensor from the workers' shards."""
        placement = dict(placement)
        if self._placements.get(name) != placement:
            self._placements[name] = placement
            self._notes_changed = True

    def record_unsaved_tensor(self, name: str, reason: str) -> None:
        """Record in the run that a tensor could not be captured (the first step it failed, and why)."""
        if name not in self._unsaved_tensors:
            self._unsaved_tensors[name] = {"step": self.step, "reason": reason}
            self._notes_changed = True

    def numbered_tensors(self, prefix: str, values: Any) -> list[tuple[str, Any]]:
        """``(<prefix><i>, tensor)`` of each tensor of a (nested) tuple, list or dict, numbered on from the
        step's earlier calls with this prefix (``dense_output_0``, ``dense_output_1``...): the numbers
        are taken, for a plugin that saves them later."""
        index = self._numbered.get(prefix, 0)
        if type(values) is tuple and len(values) == 1:  # a layer's inputs, most often
            values = values[0]
        if values is not None and not isinstance(values, NESTED) and isinstance(values, self.tensor_types):
            named = [(f"{prefix}{index}", values)]  # one tensor: no walk
        else:
            named = [(f"{prefix}{i}", v) for i, v in enumerate(leaves(values, self.tensor_types), index)]
        self._numbered[prefix] = index + len(named)
        return named

    def tensors_in(self, values: Any) -> Iterator[Any]:
        """The tensors (``tensor_types``) of a (nested) tuple, list or dict, in order, or the value itself:
        what numbered_tensors names, without taking numbers."""
        return leaves(values, self.tensor_types)

    def save_numbered(self, prefix: str, values: Any) -> None:
        """Save each tensor of a (nested) tuple, list or dict as ``<prefix><i>`` (see numbered_tensors)."""
        for name, value in self.numbered_tensors(prefix, values):
            self.save_for_step(name, value)

    def _to_numpy(self, value: Any) -> np.ndarray:
        if np.isscalar(value) and not isinstance(value, np.generic):  # as smdebug 1.0: a Python scalar
            array = np.array([value])  # is saved with shape (1,)
        else:
            array = plugins.to_numpy(value)
            if array is None:
                raise SMDebugTypeError(f"cannot convert a {type(value).__name__} to a numpy array")
        codec.check_encodable(array)  # here, where it is recorded unsaved, not only in the writer
        return array

    def _write_now(self, name: str, value: Any, colls: list[Collection] | None, wall_time=None) -> None:
        if not self._prepared:
            self._prepare()
        if not self.writing:
            return
        if self._in_step:
            self._saved_now = True
            self._write_value(name, value, colls, wall_time)
        elif self._step_mode is None and not self._closed:
            # before the first step: written into it, as smdebug 1.0 does (the steps keep their numbers)
            self._early.append((name, value, colls, wall_time))
        else:
            self._write_outside_step([(name, value, colls, wall_time)])

    def _write_value(self, name: str, value: Any, colls: list[Collection] | None, wall_time) -> None:
        if colls is None:
            self._queue(name, self._to_numpy(value), wall_time)
        else:
            self._write_for_tensor(name, value, colls)

    def _write_outside_step(self, items: list[tuple]) -> None:
        """Values saved between steps go into the last step, under its own mode and mode step (as smdebug
        1.0 writes them: the current mode's count is not advanced); with no step at all, into step 0."""
        mode = self.mode
        if self.checkpoints is not None and self.step == self.checkpoints.resumed_from:
            self.step += 1  # a restarted job's first (its checkpoint's step is the earlier job's)
            self.mode_steps[self.mode] = self.mode_step + 1
        elif self._step_mode is not None:
            self.mode = self._step_mode
        self.step = max(self.step, 0)
        self.mode_steps[self.mode] = max(self.mode_step, 0)
        self._in_step = True
        try:
            for name, value, colls, wall_time in items:
                self._write_value(name, value, colls, wall_time)
        finally:
            self._flush_reductions()
            self._in_step = False
            self.mode = mode
            if self._writer is not None:
                self._writer.end_step(self.step)

    def _write_for_tensor(self, name: str, value: Any, colls: Iterable[Collection]) -> None:
        self._write_planned(name, value, self._plan(name, value, colls))

    def _write_planned(self, name: str, value: Any, plan: tuple) -> None:
        pairs, names, raw, shape, histogram = plan
        try:
            if pairs:
                self._reduce_all(name, value, pairs, names)
            if histogram:  # for TensorBoard only: the run holds the reductions
                from smdebug import tensorboard

                tensorboard.tensor_saved(self, name, self._to_numpy(value), self.step, self.mode)
            if raw or shape:
                writer = self._writer or self._get_writer()
                if raw and not shape and not plugins.listens_to_tensors(self):
                    own = self.host_view_of
                    # the writer copies it at once: no copy of our own
                    view = plugins.host_view(value) if own is None else own(value)
                    if type(view) is np.ndarray:  # (anything else: a copy from to_numpy)
                        codec.check_encodable(view)  # recorded unsaved here, not dropped by the writer
                        if view.size == 1:  # a loss: its copy rides in the writer's message, not the ring
                            writer.write_tensor(self.step, self.mode, self.mode_step, name, view.copy())
                        else:
                            writer.write_view(self.step, self.mode, self.mode_step, name, view)
                        self._saved_any = True  # (nothing observes saved tensors: checked above)
                        return
                reserved = 0
                if raw and not shape and not isinstance(value, np.ndarray):
                    # the copy for the writer is made only once the queue has room for it
                    try:
                        nbytes = getattr(value, "nbytes", None)
                    except Exception:  # a sparse torch tensor has no storage to measure
                        nbytes = None
                    if isinstance(nbytes, int) and nbytes >= RESERVE_BYTES:
                        writer.reserve(nbytes)
                        reserved = nbytes
                try:
                    array = self._to_numpy(value)
                except BaseException:
                    if reserved:
                        writer.reserve(-reserved)
                    raise
                if shape:
                    writer.write_shape(self.step, self.mode, self.mode_step, name, array.shape)
                if raw:
                    self._queue(name, array, reserved=reserved)
        except Exception as exc:  # never break training because of one tensor
            self._not_captured(name, "save", exc)

    def _not_captured(self, name: str, what: str, exc: Exception) -> None:
        """Warn once per tensor (not at every step) and record it in the run's tensor notes."""
        reason = f"{type(exc).__name__}: {exc}"
        self.warn_once(
            f"uncaptured:{name}",  # once per tensor, whether reducing or saving it failed
            "smdebug: could not %s %s at step %d (recorded in the run, not warned again): %s",
            what,
            name,
            self.step,
            reason,
        )
        self.record_unsaved_tensor(name, f"could not {what}: {reason}")

    def _queue(self, name: str, array: np.ndarray, wall_time: float | None = None, reserved: int = 0) -> None:
        writer = self._writer or self._get_writer()
        writer.write_tensor(self.step, self.mode, self.mode_step, name, array, wall_time, reserved)
        self._saved_any = True
        plugins.tensor_saved(self, name, array)
