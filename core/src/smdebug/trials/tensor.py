"""Tensor: one saved tensor of a Trial, across steps, modes and workers."""

from __future__ import annotations

import re
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from smdebug.exceptions import (
    CorruptTensorRecord,
    InvalidWorker,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailableForStep,
)
from smdebug.layout import worker_from_file_name
from smdebug.modes import ModeKeys, to_mode
from smdebug.reductions import numpy_reduction

if TYPE_CHECKING:
    from smdebug.trials.trial import Trial


def read_mode(mode) -> ModeKeys:
    """A reader's mode argument: None means every mode (GLOBAL), as smdebug 1.0's documentation has
    ``trial.steps(mode=None)``."""
    return ModeKeys.GLOBAL if mode is None else to_mode(mode)


class StepState(Enum):
    """Whether a step of a run can be read (Trial.has_passed_step)."""

    UNAVAILABLE = 0
    AVAILABLE = 1
    NOT_YET_AVAILABLE = 2


class Location(NamedTuple):
    event_file: str
    start: int
    length: int
    crc: int | None = None  # the payload's masked CRC32C, when the index gives it


class _StepData:
    """What one worker saved of a tensor at one step: where its value is (a Location's fields, so that
    a run's thousands of records cost one object each), its shape, its stored reductions."""

    __slots__ = ("event_file", "start", "length", "crc", "shape", "_reductions")

    def __init__(self, event_file=None, start=0, length=0, crc=None, shape=None):
        self.event_file, self.start, self.length, self.crc = event_file, start, length, crc
        self.shape = shape
        self._reductions: dict | None = None

    @property
    def location(self) -> Location | None:
        """Where the value is saved; None when only its shape or reductions are."""
        return (
            None if self.event_file is None else Location(self.event_file, self.start, self.length, self.crc)
        )

    @location.setter
    def location(self, loc: Location | None) -> None:
        if loc is None:
            self.event_file = None
        else:
            self.event_file, self.start, self.length, self.crc = loc

    @property
    def reductions(self) -> dict:
        """(name, abs) -> Location"""
        if self._reductions is None:
            self._reductions = {}
        return self._reductions


class Tensor:
    def __init__(self, name: str, trial: Trial):
        self.name = name
        self.trial = trial
        # global step -> worker -> data, plus (mode, mode_step) of each global step
        self._steps: dict[int, dict[str, _StepData]] = {}
        self._modes: dict[int, tuple[ModeKeys, int]] = {}
        self._sorted_steps: list[int] | None = None  # sorted(self._steps), until a step is added

    def __repr__(self):
        return f"<smdebug Tensor {self.name!r}: {len(self._steps)} steps>"

    # -- filled by the Trial ------------------------------------------------------------------------
    def _data(self, step, mode, mode_step, worker) -> _StepData:
        self._modes[step] = (mode, mode_step)
        per_worker = self._steps.get(step)
        if per_worker is None:
            per_worker = self._steps[step] = {}
            self._sorted_steps = None
        data = per_worker.get(worker)
        if data is None:
            data = per_worker[worker] = _StepData()
        return data

    def _add_location(self, step: int, modes: tuple, worker: str, event_file, start, length, crc) -> None:
        """add_step(location=...) for the Trial's index loading, where it runs once per record."""
        data = self._data(step, *modes, worker)
        data.event_file, data.start, data.length, data.crc = event_file, start, length, crc

    def add_step(self, step, mode, mode_step, worker, location=None, shape=None) -> None:
        data = self._data(step, mode, mode_step, worker)
        if location is not None:
            data.location = location
        if shape is not None:
            data.shape = shape

    def add_reduction(self, step, mode, mode_step, worker, reduction, absolute, location) -> None:
        self._data(step, mode, mode_step, worker).reductions[(reduction, absolute)] = location

    def has_mode(self, mode: ModeKeys) -> bool:
        return any(m == mode for m, _ in self._modes.values())

    # -- steps --------------------------------------------------------------------------------------
    def steps(self, mode=ModeKeys.GLOBAL, show_incomplete_steps: bool = False) -> list[int]:
        """Steps at which this tensor was saved (mode steps when a mode is given)."""
        trial = self.trial
        trial.maybe_refresh()
        mode = read_mode(mode)
        if mode == ModeKeys.GLOBAL and (show_incomplete_steps or trial.loaded_all_steps):
            if self._sorted_steps is None:
                self._sorted_steps = sorted(self._steps)
            return list(self._sorted_steps)
        out = []
        for step in self._steps:
            m, ms = self._modes[step]
            if mode != ModeKeys.GLOBAL and m != mode:
                continue
            if show_incomplete_steps or trial.is_step_complete(step):
                out.append(step if mode == ModeKeys.GLOBAL else ms)
        return sorted(out)

    def workers(self, step_num: int, mode=ModeKeys.GLOBAL) -> list[str]:
        """The workers that saved this tensor at a step; TensorUnavailableForStep for any step it was not
        saved at (as smdebug 1.0, whose value() tells the finer StepUnavailable and StepNotYetAvailable)."""
        try:
            return sorted(self._step(step_num, mode))
        except (StepUnavailable, StepNotYetAvailable):
            raise TensorUnavailableForStep(self.name, step_num, read_mode(mode)) from None

    def prev_steps(self, step: int, n: int | None = None, mode=ModeKeys.GLOBAL) -> list[int]:
        """Up to the last n saved steps up to ``step``, the step itself included (as smdebug 1.0)."""
        upto = [s for s in self.steps(mode) if s <= step]
        return upto if n is None else upto[-n:] if n > 0 else []

    def _step(self, step_num: int, mode) -> dict[str, _StepData]:
        """Per-worker data of a step, refreshing a live trial once; the smdebug exceptions otherwise."""
        mode = read_mode(mode)
        trial = self.trial
        for attempt in (0, 1):
            g = trial.lookup_global_step(mode, step_num)
            per_worker = self._steps.get(g)
            if per_worker is not None and trial.is_step_complete(g):
                return per_worker
            if attempt == 0:
                trial.maybe_refresh(force=True)
        if per_worker is not None:  # some workers have written it so far (a live run): theirs, as smdebug 1.0
            return per_worker
        state = self.trial.has_passed_step(step_num, mode)
        if state == StepState.AVAILABLE:
            raise TensorUnavailableForStep(self.name, step_num, mode)
        if state == StepState.UNAVAILABLE:  # skipped, or past the end of a finished run (as smdebug 1.0)
            raise StepUnavailable(step_num, mode)
        raise StepNotYetAvailable(step_num, mode)

    def _worker_data(self, step_num, mode, worker) -> _StepData:
        per_worker = self._steps.get(step_num) if mode is ModeKeys.GLOBAL else None
        if per_worker is None or not self.trial.is_step_complete(step_num):
            per_worker = self._step(step_num, mode)
        if worker is None:
            # the first worker in natural order (the only one, most often: no sorting then)
            worker = next(iter(per_worker)) if len(per_worker) == 1 else min(per_worker, key=_natural)
        elif worker not in per_worker:
            # a TensorFlow device also in the form file names hold it (_job-localhost_..._device-CPU-0)
            named = worker_from_file_name(str(worker))
            if named not in per_worker:
                g = self.trial.lookup_global_step(read_mode(mode), step_num)
                if named in self.trial.workers() and not self.trial.is_step_complete(g):
                    raise StepNotYetAvailable(step_num, read_mode(mode))  # that worker has not written it yet
                raise InvalidWorker(worker)
            worker = named
        return per_worker[worker]

    # -- values -------------------------------------------------------------------------------------
    def value(self, step_num: int, mode=ModeKeys.GLOBAL, worker: str | None = None) -> np.ndarray:
        """The saved value; of a sharded tensor (each worker saved its shard): the full tensor assembled
        from the shards, or ``worker``'s shard when one is given."""
        if worker is None and self.trial.placements(self.name):
            full = self._assembled(step_num, mode)
            if full is not None:
                return full
        data = self._worker_data(step_num, mode, worker)
        if data.event_file is None:
            raise TensorUnavailableForStep(self.name, step_num, read_mode(mode), bool(data.reductions))
        return self.trial.read_value(data, self.name, step_num, mode)

    def _assembled(self, step_num: int, mode) -> np.ndarray | None:
        """The full tensor from the workers' shards at a step, None when a worker saved it whole."""
        shards = self.trial.placements(self.name)
        per_worker = self._step(step_num, mode)
        saved = {w: d for w, d in per_worker.items() if d.event_file is not None}
        if not saved or not all(w in shards for w in saved):
            return None
        full = covered = None
        for worker, data in saved.items():
            placement = shards[worker]
            part = self.trial.read_value(data, self.name, step_num, mode)
            local = tuple(placement["local_shape"])
            if tuple(part.shape) != local:
                raise CorruptTensorRecord(
                    self.name,
                    step_num,
                    read_mode(mode),
                    f"{worker}'s shard has shape {part.shape}, not {local}",
                )
            if full is None:
                full = np.empty(tuple(placement["global_shape"]), dtype=part.dtype)
                covered = np.zeros(full.shape, dtype=bool)
            where = tuple(slice(o, o + n) for o, n in zip(placement["offsets"], local))
            full[where] = part
            covered[where] = True
        if not covered.all():  # a worker's shard is missing (include_workers="one" saves gathered values)
            g = self.trial.lookup_global_step(read_mode(mode), step_num)
            if not self.trial.is_step_complete(g):  # a live run: not every worker has written the step yet
                raise StepNotYetAvailable(step_num, read_mode(mode))
            raise TensorUnavailableForStep(self.name, step_num, read_mode(mode))
        return full

    def values(self, mode=ModeKeys.GLOBAL, worker: str | None = None) -> dict[int, np.ndarray]:
        """Every saved value by step (``worker``'s: the steps it saved); a damaged one is left out (and
        reported once, with file and offset)."""
        return self._by_step(self.value, mode, worker)

    def shapes(self, mode=ModeKeys.GLOBAL, worker: str | None = None) -> dict[int, tuple]:
        """Every saved step's shape, as ``values()`` gives the values (smdebug's analysis documentation)."""
        return self._by_step(self.shape, mode, worker)

    def _by_step(self, read, mode, worker) -> dict:
        workers = self.trial.workers()
        if worker is not None and worker not in workers and worker_from_file_name(str(worker)) not in workers:
            raise InvalidWorker(worker)
        out = {}
        for s in self.steps(mode=mode):
            try:
                out[s] = read(s, mode=mode, worker=worker)
            except (CorruptTensorRecord, InvalidWorker):  # damaged, or a step that worker did not save
                continue
        return out

    def shape(self, step_num: int, mode=ModeKeys.GLOBAL, worker: str | None = None) -> tuple:
        shards = self.trial.placements(self.name) if worker is None else None
        if shards:  # a sharded tensor: the full tensor's shape
            return tuple(next(iter(shards.values()))["global_shape"])
        data = self._worker_data(step_num, mode, worker)
        if data.shape is not None:
            return data.shape
        if data.location is not None:
            return tuple(self._fetch(data.location, step_num, mode).shape)
        from smdebug.exceptions import ShapeUnavailableForStep

        raise ShapeUnavailableForStep(self.name, step_num, read_mode(mode))

    def reduction_value(
        self, step_num: int, reduction_name: str, mode=ModeKeys.GLOBAL, worker=None, abs=False
    ):
        """The stored reduction, else the reduction computed from the saved value."""
        data = self._worker_data(step_num, mode, worker)
        loc = data.reductions.get((reduction_name, bool(abs)))
        if loc is not None:
            stored = self._fetch(loc, step_num, mode, (self.name, reduction_name, bool(abs)))
            return stored.reshape(-1)[0] if stored.size == 1 else stored
        if data.location is None:
            raise TensorUnavailableForStep(self.name, step_num, read_mode(mode), bool(data.reductions))
        # a numpy value, as a stored one is (smdebug 1.0 returns numpy arrays: .item() works on either);
        # of a sharded tensor, the full tensor's, as its stored reductions are whichever worker is asked
        if worker is not None and self.trial.placements(self.name):
            worker = None
        return np.float64(numpy_reduction(self.value(step_num, mode, worker), reduction_name, abs))

    def reduction_values(self, step_num: int, mode=ModeKeys.GLOBAL, worker=None) -> dict:
        data = self._worker_data(step_num, mode, worker)
        return {key: self.reduction_value(step_num, key[0], mode, worker, key[1]) for key in data.reductions}

    def _fetch(self, loc: Location | _StepData, step_num: int, mode, key=None) -> np.ndarray:
        return self.trial.read_value(loc, self.name, step_num, read_mode(mode), key)


def _natural(name: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
