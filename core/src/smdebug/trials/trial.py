"""Trial: a saved run (local, S3 or any fsspec URI), read through its index files, live or finished."""

from __future__ import annotations

import gc
import logging
import os
import re
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from smdebug import codec, layout, open_runs, plugins
from smdebug.collection import Collection, CollectionManager
from smdebug.exceptions import (
    CorruptRunError,
    CorruptTensorRecord,
    MissingCollectionFiles,
    NoMoreData,
    SMDebugNotImplementedError,
    SMDebugValueError,
    StepUnavailable,
    TensorUnavailable,
)
from smdebug.modes import ModeKeys, to_mode
from smdebug.reductions import parse_reduction_tensor_name
from smdebug.trials.fetch import RecordFetcher
from smdebug.trials.tensor import Location, StepState, Tensor, _natural, _StepData, read_mode

logger = logging.getLogger("smdebug")


def create_trial(
    path: str | None = None,
    name: str | None = None,
    range_steps: tuple[int | None, int | None] | None = None,
    *,
    out_dir: str | None = None,
    profiler: bool = False,
    output_dir: str | None = None,
    **kwargs,
) -> Trial:
    """Open the run saved at ``path`` (or ``out_dir=``, as the reference writes it): a LocalTrial for a
    local path, an S3Trial for s3://, a Trial for any other fsspec URI.

    ``range_steps=(start, end)`` restricts the trial to the steps start <= step < end (either may be None).
    The other keywords are the Trial's; an unknown one is a TypeError. ``profiler`` and ``output_dir``
    are smdebug 1.0's, for its profiler's trials, which this library does not have.
    """
    if profiler:
        raise SMDebugNotImplementedError(
            "create_trial(profiler=True): smdebug 1.0's profiler trials are not part of this library, "
            "which reads the tensors a training run saved"
        )
    path = os.fspath(path or out_dir or "").strip()  # as smdebug 1.0: spaces around a path are not part of it
    if not path:
        raise SMDebugValueError(
            "create_trial needs the path of a run: create_trial(path) or create_trial(out_dir=...)"
        )
    protocol = path.split("://", 1)[0].lower() if "://" in path else "file"
    if protocol == "s3":
        bucket, _, prefix = path.split("://", 1)[1].partition("/")
        return S3Trial(name, bucket, prefix, range_steps=range_steps, **kwargs)
    if protocol in ("file", "local"):
        return LocalTrial(name, path, range_steps=range_steps, **kwargs)
    return Trial(path, name=name, range_steps=range_steps, **kwargs)


def _check_range_steps(range_steps) -> tuple[int, int | None] | None:
    if range_steps is None:
        return None
    try:
        start, end = range_steps
    except (TypeError, ValueError):
        raise SMDebugValueError(f"range_steps: expected (start, end), got {range_steps!r}") from None
    for value in (start, end):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise SMDebugValueError(f"range_steps: {value!r} is not a step (a non-negative integer or None)")
    if start is not None and end is not None and end <= start:
        raise SMDebugValueError(f"range_steps: expected start < end, got {range_steps!r}")
    return (start or 0, end)


class Trial:
    """A saved run, read through its index files; a live run is re-read whenever it is queried.

    ``range_steps=(start, end)`` keeps the steps start <= step < end only. ``refresh_interval`` (seconds)
    spaces out the re-reads of a live run (0: every query sees what has been written). ``dynamic_refresh``
    turns re-reading off and on (``smdebug.analysis.utils.no_refresh``/``refresh``). ``parallel``,
    ``check``, ``index_mode`` and ``cache`` are smdebug 1.0's options, accepted and without effect here.
    A local trial opened on nothing (no such folder, no run in it) says so in one warning, unless
    ``missing_ok`` (a reader started before its run is written).
    """

    def __init__(
        self,
        path: str,
        name: str | None = None,
        range_steps: tuple[int | None, int | None] | None = None,
        refresh_interval: float = 0.0,
        *,
        parallel: bool = True,
        check: bool = False,
        index_mode: bool = True,
        cache: bool = False,
        missing_ok: bool = False,
    ):
        self.path = path.rstrip("/") if len(path) > 1 else path
        self.name = name or self.path.rstrip("/").split("/")[-1]
        self.range_steps = range_steps
        self._range = _check_range_steps(range_steps)
        self.refresh_interval = refresh_interval
        self.parallel, self.check, self.index_mode, self.cache = parallel, check, index_mode, cache
        self.dynamic_refresh = True
        self.last_index_token: str | None = None  # the index file of the last complete step (as 1.0)
        open_runs.flush(self.path)  # a hook of this process writing the run: every step it saved so far
        self.store = plugins.open_store(self.path)
        if not self.store.is_local:
            self._reach()
        self._tensors: dict[str, Tensor] = {}
        self._loaded_index: set[str] = set()
        self._workers: set[str] = set()
        self._workers_for_step: dict[int, set[str]] = defaultdict(set)
        self._last_step_of_worker: dict[str, int] = {}
        self._step_mode: dict[int, tuple[ModeKeys, int]] = {}
        self._mode_to_global: dict[ModeKeys, dict[int, int]] = defaultdict(dict)
        self._tensors_at_step: dict[int, set[str]] = defaultdict(set)
        self._collections = CollectionManager()
        self._collection_files: set[str] = set()
        self._index_dirs: set[str] = set()  # folders of the index files loaded
        self._done_index_dirs: set[str] = set()  # index folders no worker writes into any more
        self._past_index_dirs: set[str] = set()  # those every worker was past at the last refresh
        self._fetcher = RecordFetcher(self.store)
        self._reported: set[tuple[str, int]] = set()  # damaged records already warned about
        self._unreadable: set[tuple[str, str]] = set()  # damaged run files already warned about
        # worker -> step -> what is wrong: steps whose index file is damaged (skipped) or holds a damaged
        # record (found when read)
        self._damaged: dict[str, dict[int, str]] = {}
        self._reduction_of: dict[str, tuple | None] = {}  # record name -> parse_reduction_tensor_name's
        # the workers' tensor notes (layout.tensor_notes_path): name -> worker -> placement of its shard,
        # and worker -> tensors it could not capture
        self._placements: dict[str, dict[str, dict]] = {}
        self._unsaved_tensors: dict[str, dict[str, dict]] = {}
        self._notes_files: set[str] = set()
        self.loaded_all_steps = False
        self._last_refresh = 0.0
        self.refresh()
        if self.loaded_all_steps and not (self._collection_files or self._loaded_index):
            raise MissingCollectionFiles()  # the job ended having saved nothing (as smdebug 1.0)
        if not (missing_ok or self._step_mode or self._collection_files) and self.store.is_local:
            self._say_empty()

    def _reach(self) -> None:
        """A remote store that does not answer (an endpoint that hangs or is down, no credentials) is one
        SMDebugValueError naming the URI and the cause, within SMDEBUG_CLI_REACH_TIMEOUT seconds (20),
        not minutes of the storage client's retries."""
        from smdebug.store import probe, reach_timeout

        problem = probe(self.store, reach_timeout())
        if problem is not None and not isinstance(problem, FileNotFoundError):  # (a run not written yet)
            raise SMDebugValueError(f"{self.store.uri}: cannot read the run: {self.store.describe(problem)}")

    def _say_empty(self) -> None:
        """One line when a local trial opens on nothing: most often a mistyped path (a run written
        later, while the trial waits for it, is read all the same)."""
        from smdebug.store import redact

        missing = not os.path.isdir(self.store.root)
        logger.warning(
            "smdebug: %s: %s: the trial has no steps until a run is written there",
            redact(self.path),
            "no such file or directory"
            if missing
            else "no smdebug run found (no index or collections files)",
        )

    def __repr__(self):
        return f"<smdebug Trial {self.name!r} path={self.path!r} steps={len(self._step_mode)}>"

    # -- loading ------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Load the index files and collections written since the last refresh."""
        # the end-of-job file is looked for before listing, so nothing written before it is missed
        ended = self.store.exists(layout.END_OF_JOB_FILE)
        new = {}  # index file -> (step, worker)
        for relpath in self._list_index():
            if relpath not in self._loaded_index:
                parsed = self._wanted(relpath)
                if parsed is not None:
                    new[relpath] = parsed
                elif layout.last_step_of_index_dir(relpath) is not None:  # a file named as a folder
                    self._loaded_index.add(relpath)  # said once
                    last = layout.last_step_of_index_dir(relpath)
                    logger.warning(
                        "smdebug: %s/%s is not a folder: steps %d-%d of every worker are not read",
                        self.path,
                        relpath,
                        last + 1 - layout.STEPS_PER_INDEX_DIR,
                        last,
                    )
        if new:
            # fetched concurrently; loaded in step order so a step is known whole or not at all
            collecting = gc.isenabled()
            gc.disable()  # tens of thousands of lasting, acyclic objects: collections only slow it down
            try:
                refused: dict[str, str] = {}  # not a regular file, or a link out of the run
                for relpath, data in sorted(self._read_index_files(new, refused).items()):
                    # the names asked for come back as asked; one spelled otherwise is parsed again
                    self._load_index(relpath, data, *(new.get(relpath) or _step_worker(relpath)))
                for relpath, why in sorted(refused.items()):
                    self._skip_damaged(relpath, *new[relpath], why)
            finally:
                if collecting:
                    gc.enable()
        self._load_collections()
        self._load_notes()
        self._mark_done_index_dirs()
        self.loaded_all_steps = ended
        self._update_last_index_token()
        self._last_refresh = time.monotonic()

    def _wanted(self, relpath: str) -> tuple[int, str] | None:
        """(step, worker) of an index file of a step within range_steps; None for any other file."""
        parsed = _step_worker(relpath)
        if parsed is None or self._range is None:
            return parsed
        start, end = self._range
        return parsed if parsed[0] >= start and (end is None or parsed[0] < end) else None

    def _update_last_index_token(self) -> None:
        last = max(self._last_step_of_worker.values(), default=-1)
        if not self.loaded_all_steps:
            last = self.last_complete_step
        workers = self._workers_for_step.get(last)
        if last >= 0 and workers:
            worker = layout.worker_in_file_name(max(workers))
            self.last_index_token = f"{self.path}/{layout.index_file_path(last, worker)}"

    def _list_index(self) -> list[str]:
        """Index files, listing again only the folders (1000 steps each) still being written."""
        if not self._done_index_dirs:
            return self.store.list(layout.INDEX_DIR)
        found = []
        for folder in self.store.list_dirs(layout.INDEX_DIR):
            if folder not in self._done_index_dirs:
                found += self.store.list(folder)
        return found

    def _mark_done_index_dirs(self) -> None:
        """An index folder every worker has written past is done once listed again after that was known
        (each worker writes its steps in order; a listing from before may have missed a lagging one's)."""
        last = self.last_complete_step
        past = set()
        for folder in self._index_dirs - self._done_index_dirs:
            folder_end = layout.last_step_of_index_dir(folder)
            if folder_end is not None and folder_end <= last:
                past.add(folder)
        self._done_index_dirs |= past & self._past_index_dirs
        self._past_index_dirs = past

    def maybe_refresh(self, force: bool = False) -> None:
        """Re-read a live run (not one that has ended, nor while ``dynamic_refresh`` is off)."""
        if self.loaded_all_steps or not self.dynamic_refresh:
            return
        if force or time.monotonic() - self._last_refresh >= self.refresh_interval:
            self.refresh()

    def _load_index(self, relpath: str, data: bytes, step: int, worker: str) -> None:
        try:
            index = layout.decode_index(data)
            mode = to_mode(index.mode)
            mode_step = step if index.mode_step is None else index.mode_step
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError, CorruptRunError) as exc:
            what = f"{type(exc).__name__}: {exc}" if not isinstance(exc, CorruptRunError) else str(exc)
            self._skip_damaged(relpath, step, worker, f"{self.path}/{relpath}: malformed index file: {what}")
            return
        event_file, entries, shapes = index.event_file, index.tensors, index.shapes
        self._loaded_index.add(relpath)
        self._index_dirs.add(relpath.rsplit("/", 1)[0])
        self._workers.add(worker)
        self._workers_for_step[step].add(worker)
        self._last_step_of_worker[worker] = max(step, self._last_step_of_worker.get(worker, -1))
        modes = self._step_mode[step] = (mode, mode_step)
        self._mode_to_global[mode][mode_step] = step
        if entries:
            self._fetcher.add_file(event_file, step, worker, entries)
        at_step = self._tensors_at_step[step]
        tensors, reduction_of = self._tensors, self._reduction_of
        for name, start, length, crc in entries:
            parsed = reduction_of.get(name, False)
            if parsed is False:
                parsed = reduction_of[name] = parse_reduction_tensor_name(name)
            if parsed is not None:
                base, reduction, absolute = parsed
                loc = Location(event_file, start, length, crc)
                self._tensor(base).add_reduction(step, mode, mode_step, worker, reduction, absolute, loc)
                at_step.add(base)
            else:
                tensor = tensors.get(name)
                if tensor is None:
                    tensor = self._tensor(name)
                tensor._add_location(step, modes, worker, event_file, start, length, crc)
                at_step.add(name)
        for name, shape in shapes:
            self._tensor(name).add_step(step, mode, mode_step, worker, shape=shape)
            at_step.add(name)

    def _read_index_files(self, relpaths, refused: dict[str, str]) -> dict[str, bytes]:
        """The index files' bytes; one the store refuses to read (a FIFO, a device, a link out of the
        run: CorruptRunError) is left out, and why put in ``refused``."""
        try:
            return self.store.read_many(relpaths)
        except CorruptRunError:  # which one: each alone
            found = {}
            for relpath in relpaths:
                try:
                    found.update(self.store.read_many([relpath]))
                except CorruptRunError as exc:
                    refused[relpath] = str(exc)
            return found

    def _skip_damaged(self, relpath: str, step: int, worker: str, why: str) -> None:
        """A step whose index file cannot be read: left out of the trial, said once and listed by
        ``corrupt()`` / ``corrupt_steps()`` (the rest of the run reads as usual)."""
        self._loaded_index.add(relpath)  # published whole by the writer: it will not get better
        self._damaged.setdefault(worker, {})[step] = why
        logger.warning("smdebug: skipping damaged step %d of %s: %s", step, worker, why)

    def read_record(
        self, loc: Location | _StepData, tname: str, step: int, mode: ModeKeys, failed=None
    ) -> bytes:
        """The payload of one saved record; a damaged one is reported once (file, offset) and skipped
        by raising CorruptTensorRecord. ``failed``: the error a read of it just gave (not asked again)."""
        where = f"{self.path}/{loc.event_file}"
        raw = self._fetcher.get(loc.event_file, loc.start, loc.length) if failed is None else failed
        if isinstance(raw, BaseException) and not self.store.is_local:
            from smdebug.store import StoreUnavailableError, is_transient

            if is_transient(raw):  # the store did not answer (an outage): no damage, a later read may work
                raise StoreUnavailableError(f"could not read {where}: {self.store.describe(raw)}") from None
        try:
            if isinstance(raw, BaseException):
                raise CorruptRunError(
                    f"{where}: record at offset {loc.start} cannot be read: {self.store.describe(raw)}"
                )
            return codec.read_record(raw, path=where, offset=loc.start, crc=loc.crc)
        except CorruptRunError as exc:
            if (loc.event_file, loc.start) not in self._reported:
                self._reported.add((loc.event_file, loc.start))
                logger.warning("smdebug: skipping a damaged record of %s: %s", tname, exc)
                info = self._fetcher.files.get(loc.event_file)
                if info is not None:
                    self._damaged.setdefault(info.worker, {}).setdefault(info.step, str(exc))
            raise CorruptTensorRecord(tname, step, mode, str(exc)) from None

    def read_value(
        self, loc: Location | _StepData, tname: str, step: int, mode: ModeKeys, key=None
    ) -> np.ndarray:
        """The tensor a saved record holds; CorruptTensorRecord (reported once) when it is damaged.
        ``key`` names the record's layout for codec.tensor_at (default: tname)."""
        buf, pos = self._fetcher.locate(loc.event_file, loc.start, loc.length)
        if not isinstance(buf, BaseException):
            value = codec.tensor_at(buf, pos, loc.length, loc.crc, key or tname)
            if value is not None:
                return value
        # not the usual dense record, or a damaged one: the full decoder, which says what is wrong
        mode = read_mode(mode)
        payload = self.read_record(loc, tname, step, mode, buf if isinstance(buf, BaseException) else None)
        where = f"{self.path}/{loc.event_file}: record at offset {loc.start}"
        try:
            value = codec.decode_tensor_value(payload)
        except CorruptRunError as exc:
            raise CorruptTensorRecord(tname, step, mode, f"{where}: {exc}") from None
        if value is None:
            raise CorruptTensorRecord(tname, step, mode, f"{where} holds no tensor")
        return value

    def _tensor(self, name: str) -> Tensor:
        t = self._tensors.get(name)
        if t is None:
            t = self._tensors[name] = Tensor(name, self)
        return t

    def _load_collections(self) -> None:
        files = [p for p in self.store.list(layout.COLLECTIONS_DIR) if layout.is_collections_file(p)]
        # Collections files are rewritten while a run goes on: reload all of them until it has ended.
        if not files or (self.loaded_all_steps and set(files) == self._collection_files):
            return
        for relpath, data in sorted(self.store.read_many(files).items()):
            loaded = CollectionManager.from_json(
                data.decode("utf-8", "replace"), source=f"{self.path}/{relpath}"
            )
            for name, coll in loaded.collections.items():
                mine = self._collections.collections.get(name)
                if mine is None:
                    self._collections.collections[name] = coll
                else:
                    mine.tensor_names = mine.tensor_names | coll.tensor_names
                    mine.include(coll.include_regex)
            self._collections.meta["num_workers"] = max(
                self._collections.meta.get("num_workers", 1), loaded.meta.get("num_workers", 1)
            )
        self._collection_files = set(files)

    def _load_notes(self) -> None:
        """Shard placements and tensors not captured, of the runs that note any (rewritten while the run
        goes on, like collections files)."""
        files = [p for p in self.store.list(layout.NOTES_DIR) if p.endswith(".json")]
        if not files or (self.loaded_all_steps and set(files) == self._notes_files):
            return
        for relpath, data in sorted(self.store.read_many(files).items()):
            worker = _file_worker(relpath)
            try:
                placements, unsaved = layout.decode_notes(data)
            except (ValueError, TypeError) as exc:
                self._warn_unreadable(relpath, exc)
                continue
            for name, placement in placements.items():
                self._placements.setdefault(name, {})[worker] = placement
            if unsaved:
                self._unsaved_tensors[worker] = unsaved
        self._notes_files = set(files)

    def _warn_unreadable(self, relpath: str, exc: Exception, said: str | None = None) -> None:
        """Warn once of a damaged run file (its readers are asked again and again: ``unsaved_steps`` reads
        ``unsaved()``, a live trial reloads its notes); ``said``: the warning, when the error names the
        file itself."""
        if (relpath, str(exc)) not in self._unreadable:
            self._unreadable.add((relpath, str(exc)))
            logger.warning("smdebug: %s", said or f"{self.path}/{relpath} is not readable: {exc}")

    def placements(self, tname: str) -> dict[str, dict]:
        """Per worker, where its saved value of a sharded tensor lies in the full tensor (global_shape,
        offsets, local_shape, mesh_shape, coordinate, placements); empty for a tensor saved whole."""
        return dict(self._placements.get(tname, {}))

    def unsaved_tensors(self) -> dict[str, dict[str, dict]]:
        """Per worker, the tensors it could not capture: name -> {"step": the first, "reason"}."""
        self.maybe_refresh()
        return {w: dict(t) for w, t in self._unsaved_tensors.items()}

    # -- steps and workers --------------------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        return max(int(self._collections.meta.get("num_workers", 1)), 1)

    @property
    def last_complete_step(self) -> int:
        """The last step every worker has passed (-1 before that)."""
        if len(self._last_step_of_worker) < self.num_workers:
            return -1
        return min(self._last_step_of_worker.values())

    def workers(self) -> list[str]:
        self.maybe_refresh()
        return sorted(self._workers, key=_natural)

    def saved_steps(self, mode=ModeKeys.GLOBAL) -> list[int]:
        """Every step loaded so far (mode steps when a mode is given), finished by all workers or not."""
        mode = read_mode(mode)
        if mode == ModeKeys.GLOBAL:
            return sorted(self._step_mode)
        return sorted(self._mode_to_global[mode])

    def is_step_complete(self, global_step: int) -> bool:
        """Whether every worker has written the step (or never will: a later step or the end is seen)."""
        if self.loaded_all_steps:
            return True
        workers = self._workers_for_step.get(global_step)
        return (workers is not None and len(workers) >= self.num_workers) or (
            global_step <= self.last_complete_step
        )

    def steps(self, mode=ModeKeys.GLOBAL, show_incomplete_steps: bool = False) -> list[int]:
        """Saved steps (mode steps when a mode is given) that every worker has finished."""
        self.maybe_refresh()
        mode = read_mode(mode)
        return [
            s
            for s in self.saved_steps(mode)
            if show_incomplete_steps or self.is_step_complete(self.lookup_global_step(mode, s))
        ]

    def lookup_global_step(self, mode: ModeKeys, step: int) -> int:
        """The global step of a mode step known so far (-1 when none), without reading anything."""
        return step if mode == ModeKeys.GLOBAL else self._mode_to_global[mode].get(step, -1)

    def global_step(self, mode, mode_step: int) -> int | None:
        """The global step of a mode step (the step itself for GLOBAL); None for a mode step not saved (as
        smdebug 1.0, and as mode_modestep of a global step not saved)."""
        mode = read_mode(mode)
        if mode == ModeKeys.GLOBAL:
            return mode_step
        if mode_step not in self._mode_to_global[mode]:
            self.maybe_refresh(force=True)
        return self._mode_to_global[mode].get(mode_step)

    def mode_modestep(self, global_step: int) -> tuple[ModeKeys | None, int | None]:
        """(mode, mode step) of a saved global step; (None, None) for a step not saved (as smdebug 1.0)."""
        if global_step not in self._step_mode:
            self.maybe_refresh(force=True)
        return self._step_mode.get(global_step, (None, None))

    def mode(self, global_step: int) -> ModeKeys | None:
        return self.mode_modestep(global_step)[0]

    def mode_step(self, global_step: int) -> int | None:
        return self.mode_modestep(global_step)[1]

    def modes(self, include_global: bool = False) -> list[ModeKeys]:
        """The modes of the saved steps, in the order they first appear. As in smdebug 1.0, GLOBAL (the
        mode of steps saved while no mode was set) only with ``include_global``."""
        self.maybe_refresh()
        first: dict[ModeKeys, int] = {}
        for step, (mode, _) in self._step_mode.items():
            if step < first.get(mode, step + 1):
                first[mode] = step
        return [m for m in sorted(first, key=first.get) if include_global or m is not ModeKeys.GLOBAL]

    def has_passed_step(self, step: int, mode=ModeKeys.GLOBAL) -> StepState:
        self.maybe_refresh()
        mode = read_mode(mode)
        all_steps = self.saved_steps(mode)
        i = bisect_left(all_steps, step)
        if i < len(all_steps):
            g = self.lookup_global_step(mode, all_steps[i])
            if all_steps[i] == step:
                return StepState.AVAILABLE if self.is_step_complete(g) else StepState.NOT_YET_AVAILABLE
            # a later step exists: this one was skipped once every worker has passed the later one
            if g <= self.last_complete_step or self.loaded_all_steps:
                return StepState.UNAVAILABLE
            return StepState.NOT_YET_AVAILABLE
        return StepState.UNAVAILABLE if self.loaded_all_steps else StepState.NOT_YET_AVAILABLE

    def wait_for_steps(
        self, required_steps: Iterable[int], mode=ModeKeys.GLOBAL, timeout: float | None = None
    ) -> None:
        """Block until every step is available; StepUnavailable / NoMoreData when it never will be."""
        mode = read_mode(mode)
        deadline = None if timeout is None else time.monotonic() + timeout
        for step in required_steps:
            delay = 0.05
            while True:
                state = self.has_passed_step(step, mode)
                if state == StepState.NOT_YET_AVAILABLE and not self.loaded_all_steps:
                    self.refresh()
                    state = self.has_passed_step(step, mode)
                if state == StepState.AVAILABLE:
                    break
                if state == StepState.UNAVAILABLE:
                    saved = self.saved_steps(mode)
                    last = saved[-1] if saved else -1
                    if self.loaded_all_steps and step > last:
                        raise NoMoreData(step, mode, last)
                    raise StepUnavailable(step, mode)
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"step {step} of mode {mode.name} did not appear in {self.path} within {timeout}s"
                    )
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def training_ended(self) -> bool:
        self.maybe_refresh()
        return self.loaded_all_steps

    # -- tensors and collections --------------------------------------------------------------------
    def tensor_names(
        self, show_prefixed_tensors=False, *, step=None, mode=ModeKeys.GLOBAL, regex=None, collection=None
    ) -> list[str]:
        if regex is not None and collection is not None:
            raise SMDebugValueError(
                "tensor_names: give regex or collection, not both (as smdebug 1.0); "
                "intersect two calls for tensors matching both"
            )
        self.maybe_refresh()
        mode = read_mode(mode)
        if step is None:
            names = (
                set(self._tensors)
                if mode == ModeKeys.GLOBAL
                else {n for n, t in self._tensors.items() if t.has_mode(mode)}
            )
        else:
            names = set(self._tensors_at_step.get(self.lookup_global_step(mode, step), ()))
        if regex is not None:
            patterns = [regex] if isinstance(regex, str) else list(regex)
            compiled = re.compile("|".join(f"(?:{p})" for p in patterns))
            names = {n for n in names if compiled.search(n)}
        if collection is not None:
            names = {n for n in names if any(c.matches(n) for c in self._collections_named(collection))}
        return sorted(names)

    def _collections_named(self, collection) -> list[Collection]:
        items = [collection] if isinstance(collection, (str, Collection)) else list(collection)
        found = []
        for item in items:
            if isinstance(item, Collection):
                found.append(item)
            elif item in self._collections.collections:
                found.append(self._collections.collections[item])
        return found

    def tensor(self, tname: str) -> Tensor:
        if tname not in self._tensors:
            self.maybe_refresh(force=True)
        if tname not in self._tensors:
            raise TensorUnavailable(tname, self._tensors)
        return self._tensors[tname]

    def tensors(self, *args, **kwargs) -> list[str]:
        """The older name of ``tensor_names`` (the overview's example still uses it)."""
        return self.tensor_names(*args, **kwargs)

    def has_tensor(self, tname: str) -> bool:
        if tname not in self._tensors:
            self.maybe_refresh()
        return tname in self._tensors

    # -- smdebug 1.0's shortcuts to a step's model inputs, labels and predictions -----------------------
    def inputs(self, step: int, mode=ModeKeys.GLOBAL) -> list[np.ndarray]:
        """The values at ``step`` of the ``inputs`` collection's tensors (Keras' ``model_input_0``...)."""
        return self._values_in_order(step, mode, collection="inputs")

    def labels(self, step: int, mode=ModeKeys.GLOBAL) -> list[np.ndarray]:
        """The values at ``step`` of the tensors whose names hold ``label`` (smdebug 1.0's search for
        ``labels*``): XGBoost's ``labels``, Keras' ``labels_<i>``."""
        return self._values_in_order(step, mode, regex="labels*")

    def predictions(self, step: int, mode=ModeKeys.GLOBAL) -> list[np.ndarray]:
        """The values at ``step`` of the tensors whose names hold ``prediction`` (smdebug 1.0's search for
        ``predictions*``): ``predictions``, ``predictions_<i>``."""
        return self._values_in_order(step, mode, regex="predictions*")

    def _values_in_order(self, step: int, mode, **which) -> list[np.ndarray]:
        def number(name: str) -> int:  # numbered names in their order: input_2 before input_10
            found = re.search(r"_(\d+)$", name)
            return int(found.group(1)) if found else 0

        names = sorted(self.tensor_names(step=step, mode=mode, **which), key=number)
        return [self.tensor(name).value(step, mode=mode) for name in names]

    def collections(self) -> dict[str, Collection]:
        self.maybe_refresh()
        return dict(self._collections.collections)

    def collection(self, coll_name: str) -> Collection:
        """The saved collection, or a new empty one, registered in the trial (as smdebug 1.0): what is
        included in it counts for ``tensor_names(collection=...)`` and stays on later calls."""
        self.maybe_refresh()
        return self._collections.get(coll_name)

    # -- steps the run lost (recorded by our writer at close; smdebug 1.0 has no such record) ------------
    def unsaved(self) -> dict[str, dict[int, str]]:
        """Per worker, the steps it could not save (disk full, an outage that outlasted the retries) and
        why; empty when every step was saved or the run recorded nothing (interrupted, or smdebug 1.0)."""
        found: dict[str, dict[int, str]] = {}
        files = [p for p in self.store.list(layout.UNSAVED_DIR) if p.endswith(".json")]
        for relpath, data in sorted(self.store.read_many(files).items()):
            worker = _file_worker(relpath)
            try:
                steps = layout.decode_unsaved(data)
            except (ValueError, KeyError, TypeError) as exc:
                self._warn_unreadable(relpath, exc)
                continue
            if self._range is not None:
                start, end = self._range
                steps = {s: r for s, r in steps.items() if s >= start and (end is None or s < end)}
            if steps:
                found[worker] = steps
        return found

    # -- damaged steps (a damaged index file's step is skipped; a damaged record's is listed once read) --
    def corrupt(self) -> dict[str, dict[int, str]]:
        """Per worker, the steps found damaged and what is wrong (the file named): a step whose index
        file is malformed or not a regular file (left out of ``steps()`` and of every tensor's steps), or
        that holds a damaged record (listed once that record was read: ``value()`` raises
        CorruptTensorRecord for it, the step's other records stay readable)."""
        self.maybe_refresh()
        return {w: dict(sorted(steps.items())) for w, steps in sorted(self._damaged.items())}

    def corrupt_steps(self) -> list[int]:
        """The damaged steps, sorted (``corrupt()`` says which worker and why)."""
        return sorted({step for steps in self.corrupt().values() for step in steps})

    # -- health monitoring (hooks with health=True write a record per worker; smdebug 1.0 lists none) --------
    def health_records(self) -> list[dict]:
        """Each worker's health record: its first non-finite value (or None), the triggers that wrote its
        flight recorder, the recorder's size; empty when the run was not watched (health=False)."""
        from smdebug.health import HEALTH_DIR

        records = []
        files = [p for p in self.store.list(HEALTH_DIR) if p.endswith(".json")]
        for relpath, data in sorted(self.store.read_many(files).items()):
            try:
                record = layout.load_json(data)
            except ValueError as exc:
                self._warn_unreadable(relpath, exc)
                continue
            if isinstance(record, dict):
                for part in (record, record.get("first_nonfinite")):  # the worker as workers() names it
                    if isinstance(part, dict) and isinstance(part.get("worker"), str):
                        part["worker"] = layout.worker_from_file_name(part["worker"])
                records.append(record)
        return records

    def rule_firings(self) -> list[dict]:
        """Every firing of the rules a hook ran during training (``hook.add_rule``, whatever the action),
        oldest first: dicts with ``rule``, ``step``, ``mode``, ``mode_step``, ``reason`` (also as
        ``message``), ``actions``, ``time`` and ``worker``; empty when none fired. A worker's unreadable
        record is skipped with a warning naming it."""
        from smdebug.firings import FIRINGS_DIR, decode_firings

        firings: list[dict] = []
        files = [p for p in self.store.list(FIRINGS_DIR) if p.endswith(".json")]
        for relpath, data in sorted(self.store.read_many(files).items()):
            worker = _file_worker(relpath)
            try:
                found = decode_firings(data, f"{self.path}/{relpath}")
            except CorruptRunError as exc:
                self._warn_unreadable(relpath, exc, str(exc))  # it names the file
                continue
            firings += [{**f, "worker": layout.worker_from_file_name(f["worker"] or worker)} for f in found]
        return sorted(firings, key=lambda f: (f["step"], f["time"] or 0.0, f["worker"], f["rule"]))

    def first_nonfinite(self) -> dict | None:
        """Where the run's first non-finite value appeared: a dict with ``step``, ``mode``, ``mode_step``,
        ``direction`` ("input", "forward", "loss" or "backward"), ``module``, ``tensor`` and ``worker``;
        None when no worker saw one (or the run was not watched)."""
        from smdebug.health import first_nonfinite

        return first_nonfinite(self.health_records())

    @property
    def unsaved_steps(self) -> list[int]:
        """The steps some worker could not save, sorted (see ``unsaved()`` for who and why)."""
        return sorted({step for steps in self.unsaved().values() for step in steps})


class LocalTrial(Trial):
    """A run in a local folder (smdebug 1.0's name and arguments: ``LocalTrial(name, dirname, ...)``)."""

    def __init__(self, name: str | None, dirname: str, range_steps=None, **kwargs):
        super().__init__(dirname, name=name, range_steps=range_steps, **kwargs)


class S3Trial(Trial):
    """A run on S3 (smdebug 1.0's name and arguments: ``S3Trial(name, bucket_name, prefix_name, ...)``)."""

    def __init__(self, name: str | None, bucket_name: str, prefix_name: str, range_steps=None, **kwargs):
        self.bucket_name, self.prefix_name = bucket_name, prefix_name.strip("/")
        path = f"s3://{bucket_name}/{self.prefix_name}" if self.prefix_name else f"s3://{bucket_name}"
        super().__init__(path, name=name, range_steps=range_steps, **kwargs)


def _step_worker(relpath: str) -> tuple[int, str] | None:
    """(step, worker) of an index file, the worker named as workers() names it."""
    parsed = layout.parse_index_file_name(relpath)
    return parsed and (parsed[0], layout.worker_from_file_name(parsed[1]))


def _file_worker(relpath: str) -> str:
    """The worker of a per-worker JSON file (``unsaved_steps/<worker>.json``, ...)."""
    return layout.worker_from_file_name(relpath.rsplit("/", 1)[-1][: -len(".json")])
