"""The hook's reductions (a part of BaseHook): started where a tensor lives, through the plugins'
reduction hooks (a ``together`` block's in one call), numpy's one-by-one fallback, and the step's pending
results brought to the host together and queued for writing at its end."""

from __future__ import annotations

import contextlib
import operator
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from smdebug import plugins
from smdebug.exceptions import SMDebugTypeError
from smdebug.reductions import reduction_tensor_name


class HookReducing:
    """BaseHook's reductions; it uses the hook's step, writer and pending reductions."""

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """The reductions of the tensors saved within the block are started together at its end, in one
        ``smdebug_reductions`` call (the framework reduces them in a few kernels, not one per tensor). For
        tensors that cannot change before the block ends (a model's parameters in a loop over them)."""
        if self._gathered is not None:  # nested: the outer block starts them
            yield
            return
        self._gathered = []
        try:
            yield
        finally:
            gathered, self._gathered = self._gathered, None
            if gathered:
                self._start_reductions(gathered)

    def _reduce(self, value: Any, reduction: str, abs: bool) -> float:
        result = plugins.reduce(value, reduction, abs)
        if result is None:
            raise SMDebugTypeError(f"no plugin can compute {reduction} of a {type(value).__name__}")
        return result

    def _reduce_all(
        self, name: str, value: Any, pairs: tuple[tuple[str, bool], ...], names: list[str] | None = None
    ) -> None:
        """A tensor's reductions: started where it lives (with the others of a ``together`` block) and
        brought to the host with the rest of the step's at its end (one transfer per step)."""
        if names is None:
            names = [reduction_tensor_name(name, r, a, self.reduction_names_keep_index) for r, a in pairs]
        if self._gathered is not None:
            self._gathered.append((name, value, pairs, names))
        else:
            self._start_reductions([(name, value, pairs, names)])

    def _start_reductions(self, items: list[tuple]) -> None:
        """One smdebug_reductions call per set of requested reductions; what no plugin reduces where it
        lives is reduced one by one (numpy's fallback)."""
        groups: dict[tuple, list[tuple]] = {}
        for item in items:
            groups.setdefault(item[2], []).append(item)
        for pairs, members in groups.items():
            values = [m[1] for m in members]
            started = plugins.reductions(values, list(pairs))
            self._take_started([m[0] for m in members], values, pairs, started, [m[3] for m in members])

    def _take_started(
        self, names: Sequence[str], values: list, pairs: tuple, started: list | None, reduction_names: list
    ) -> None:
        """Keep the reductions a plugin started for these tensors (``reduction_names[i]`` names the
        results of ``values[i]``) until the step's end; reduce with numpy those it did not start."""
        if started is not None and not any(r is None for r in started):  # the common case, in bulk
            self._pending.extend(started)
            self._pending_names.append(reduction_names)
            return
        for i, (name, value, some) in enumerate(zip(names, values, reduction_names)):
            result = started[i] if started is not None else None
            if result is not None:
                self._pending.append(result)
                self._pending_names.append([some])
                continue
            try:
                self._reduce_one_by_one(name, value, pairs)
            except Exception as exc:  # never break training because of one tensor
                self._not_captured(name, "reduce", exc)

    def _reduce_one_by_one(self, name: str, value: Any, pairs: tuple[tuple[str, bool], ...]) -> None:
        for reduction, absolute in pairs:
            try:
                result = self._reduce(value, reduction, absolute)
            except ValueError as exc:  # undefined for this value (empty): the raw tensor still goes
                self.warn_once(f"reduce:{name}", "smdebug: no reductions of %s: %s", name, exc)
                return
            # 0-d, in the reduction's dtype when the plugin gives a numpy scalar, as smdebug 1.0
            result = np.asarray(result if isinstance(result, np.generic) else float(result))
            rname = reduction_tensor_name(name, reduction, absolute, self.reduction_names_keep_index)
            self._queue(rname, result)
            self._note_reduced([[rname]])

    def _flush_reductions(self) -> None:
        """Queue the step's pending reductions, brought to the host together."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        chunks, self._pending_names = self._pending_names, []
        # the same lists at every step, the writers know them by identity: one block's alone, or the
        # blocks' joined as at the last step when the blocks are the same lists (the weights', the gradients')
        if len(chunks) == 1:
            names = chunks[0]
        else:
            last, names = self._joined_names
            if len(last) != len(chunks) or not all(map(operator.is_, last, chunks)):
                names = [some for chunk in chunks for some in chunk]
                self._joined_names = (chunks, names)  # holding the blocks keeps their ids their own
        try:
            rows = plugins.to_host(pending)
        except Exception as exc:  # the step's reductions are lost: each is recorded in the run
            reason = f"could not be copied to the host: {type(exc).__name__}: {exc}"
            self.warn_once(
                "to_host", "smdebug: step %d's reductions %s (recorded in the run)", self.step, reason
            )
            for some in names:
                for name in some:
                    self.record_unsaved_tensor(name, reason)
            return
        with self.guard("save reductions"):
            self._write_reductions(names, rows)

    def _write_reductions(self, names: list[list[str]], rows) -> None:
        """Queue reductions: ``rows[i]`` (a 1-d host array) holds the 0-d values named ``names[i]``."""
        writer = self._writer or self._get_writer()
        writer.write_scalars(self.step, self.mode, self.mode_step, names, rows, time.time())
        self._note_reduced(names)
        if plugins.listens_to_tensors(self):
            for some, results in zip(names, rows):
                for name, result in zip(some, results):
                    plugins.tensor_saved(self, name, np.asarray(result))
        self._saved_any = True

    def _note_reduced(self, names: list[list[str]]) -> None:
        """Remember the reductions this step wrote: the health recorder does not write them twice."""
        step, done = self._reduced
        if step != self.step:
            self._reduced = (self.step, done := [])
        done.extend(names)
