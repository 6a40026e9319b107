"""TensorBoard summaries: an event-file writer, the hook's live exporter, and export of a saved run.

Layout, as smdebug 1.0 writes it: one folder per mode under the TensorBoard directory
(``<dir>/TRAIN``, ``<dir>/EVAL``, ...), each a TensorBoard run holding ``<step:012d>_<worker>*.tfevents``
files; summary steps are global steps. What becomes a summary (``summaries_for``):

- a scalar summary, tagged with the tensor's name, for a one-element value of a scalar collection
  (losses, metrics, ...) and for ``hook.save_scalar`` values (``scalar/<name>``);
- a scalar summary for every stored reduction, tagged with its stored name
  (``smdebug/reductions/<reduction>/<tensor>``), so a reductions-only run still shows its curves;
- a histogram, tagged ``<collection>/<tensor>``, for a numeric tensor of a collection whose
  ``save_histogram`` is true (never for scalar collections), of its finite values; the hook's export
  histograms a tensor saved as reductions only too (as smdebug 1.0), of the value it saw, which an export
  of the saved run cannot (the run holds the reductions).

The hook writes them while training when ``export_tensorboard=True`` or ``tensorboard_dir`` is given
(through the observation hooks, off the training thread); ``export_tensorboard(trial, logdir)`` and
``smdebug export-tensorboard OUT LOGDIR`` write them from a saved run.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterable

import numpy as np

from smdebug import codec, layout
from smdebug.collection import SCALAR_COLLECTIONS, Collection
from smdebug.exceptions import CorruptTensorRecord, SMDebugError
from smdebug.modes import ModeKeys, to_mode
from smdebug.reductions import REDUCTIONS_PREFIX
from smdebug.store import Store

logger = logging.getLogger("smdebug")

__all__ = ["SummaryWriter", "summaries_for", "export_tensorboard"]

SCALAR_PREFIX = "scalar/"  # hook.save_scalar's names
_GENERIC_COLLECTIONS = ("all", "default")  # a histogram is named after a more telling collection first


def summaries_for(name: str, value: np.ndarray, collections: Iterable[Collection]) -> list[tuple[str, str]]:
    """The summaries a saved tensor gets, as (kind, tag) pairs with kind "scalar" or "histogram"."""
    value = np.asarray(value)
    if value.dtype.kind not in "iuf" or value.size == 0:  # bools, strings, complex: nothing to draw
        return []
    colls = sorted(collections, key=lambda c: (c.name in _GENERIC_COLLECTIONS, c.name))
    if name.startswith(REDUCTIONS_PREFIX) or name.startswith(SCALAR_PREFIX):
        return [("scalar", name)] if value.size == 1 else []
    # a scalar collection, the core's or a plugin's (whose hook saves it without histograms)
    if any(c.name in SCALAR_COLLECTIONS or not c.save_histogram for c in colls):
        return [("scalar", name)] if value.size == 1 else []
    for coll in colls:
        if coll.save_histogram:
            return [("histogram", f"{coll.name}/{name}")]
    return []


class SummaryWriter:
    """Appends TensorBoard scalar and histogram events to an event file of ``logdir/<MODE>``.

    Local files are appended to and flushed, so TensorBoard can follow a live run. On object stores
    (where an object cannot grow) each ``flush`` writes the new events as a further file of the same
    folder, named after its first step, which TensorBoard reads in order as one run.
    """

    def __init__(
        self,
        logdir: str,
        mode: ModeKeys | str | None = None,
        worker: str = "worker_0",
        step: int = 0,
        unique: bool = True,
    ):
        from smdebug import plugins

        self.store: Store = plugins.open_store(logdir)
        self.folder = to_mode(mode).name if mode is not None else ""
        self.worker = worker
        # unique: the process id keeps a second run writing to the same folder from replacing the first
        self._suffix = f"_{worker}_{os.getpid()}.tfevents" if unique else f"_{worker}.tfevents"
        self._pending: list[bytes] = [codec.frame(codec.encode_file_version_event(time.time()))]
        self._first_step = max(int(step), 0)
        self._handle = None
        self.paths: list[str] = []

    def _relpath(self, step: int) -> str:
        name = f"{step:012d}{self._suffix}"
        return f"{self.folder}/{name}" if self.folder else name

    def add_scalar(self, tag: str, value, step: int, wall_time: float | None = None) -> None:
        event = codec.encode_scalar_event(tag, value, int(step), wall_time or time.time())
        self._add(event, step)

    def add_histogram(self, tag: str, values, step: int, wall_time: float | None = None) -> bool:
        """Add a histogram of the finite values (NaN and infinities are left out); False when there
        is none, so nothing was added."""
        values = np.asarray(values).reshape(-1)
        if values.dtype.kind == "f":
            values = values[np.isfinite(values)]
        if values.size == 0:
            return False
        self._add(codec.encode_histogram_event(tag, values, int(step), wall_time or time.time()), step)
        return True

    def add_summary(self, summary: bytes, step: int, wall_time: float | None = None) -> None:
        """Add a serialized Summary as it is (TensorFlow's own summary ops)."""
        self._add(codec.encode_summary_event(summary, int(step), wall_time or time.time()), step)

    def _add(self, event: bytes, step: int) -> None:
        if not self._pending and not self.store.is_local and self._handle is None:
            self._first_step = max(int(step), 0)  # the next object is named after its first step
        self._pending.append(codec.frame(event))

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending = []
        if self.store.is_local:
            if self._handle is None:
                relpath = self._relpath(self._first_step)
                self._handle = self.store.open_write(relpath)
                self.paths.append(self.store.path(relpath))
            self._handle.write(data)
            self._handle.flush()
        else:
            relpath = self._relpath(self._first_step)
            if self.paths and self.paths[-1] == self.store.path(relpath):
                relpath = relpath.replace(".tfevents", f"_{len(self.paths)}.tfevents")
            self.store.write_bytes(relpath, data)
            self.paths.append(self.store.path(relpath))

    def close(self) -> None:
        self.flush()
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------------------
# The hook's exporter (smdebug.defaults calls it from the observation hooks), one background thread per hook.


class _HookExporter:
    def __init__(self, tensorboard_dir: str, worker: str):
        self.dir = tensorboard_dir
        self.worker = worker
        self.writers: dict[ModeKeys, SummaryWriter] = {}
        self.failed = False
        self._queue: queue.Queue = queue.Queue(maxsize=256)  # bounded: training waits, nothing dropped
        self._thread = threading.Thread(target=self._run, name="smdebug-tensorboard", daemon=True)
        self._thread.start()

    def put(self, item) -> None:
        if not self.failed:
            self._queue.put(item)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(("close",))
            self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item[0] == "close":
                    for writer in self.writers.values():
                        writer.close()
                    return
                if self.failed:
                    continue
                if item[0] == "flush":
                    for writer in self.writers.values():
                        writer.flush()
                else:
                    kind, mode, tag, value, step, wall_time = item
                    writer = self.writers.get(mode)
                    if writer is None:
                        writer = self.writers[mode] = SummaryWriter(self.dir, mode, self.worker, step)
                    if kind == "scalar":
                        writer.add_scalar(tag, value, step, wall_time)
                    elif kind == "summary":
                        writer.add_summary(value, step, wall_time)
                    else:
                        writer.add_histogram(tag, value, step, wall_time)
            except SMDebugError as exc:  # a value that cannot be summarised: skip it, keep exporting
                logger.warning("smdebug: TensorBoard summary %s skipped: %s", item[2:3], exc)
            except Exception as exc:  # never break training: warn once and stop exporting
                self.failed = True
                logger.warning(
                    "smdebug: TensorBoard export to %s stopped: %s: %s", self.dir, type(exc).__name__, exc
                )


_exporters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_exporters_lock = threading.Lock()


def _exporter(hook) -> _HookExporter | None:
    tb_dir = getattr(hook, "tensorboard_dir", None)
    if not tb_dir or getattr(hook, "dry_run", False):
        return None
    found = _exporters.get(hook)
    if found is None:
        with _exporters_lock:
            found = _exporters.get(hook)
            if found is None:
                found = _exporters[hook] = _HookExporter(tb_dir, getattr(hook, "worker", "worker_0"))
    return found


def _hook_collections(hook, name: str) -> list[Collection]:
    """The hook's collections due for this tensor now (all of its collections for an explicit save)."""
    try:
        colls = hook.collections_of(name)
        due = colls.intersection(hook.due_collections)
        return list(due or colls)
    except AttributeError:  # a hook that is not a BaseHook
        return []


# -- the hook's export (called by smdebug.defaults' observation hooks for hooks with a tensorboard_dir) --
def tensor_saved(hook, name, value, step, mode):
    try:
        exporter = _exporter(hook)
        if exporter is None or exporter.failed:
            return
        wall_time = time.time()
        for kind, tag in summaries_for(name, value, _hook_collections(hook, name)):
            exporter.put((kind, to_mode(mode), tag, value, int(step), wall_time))
    except Exception as exc:  # never break training
        logger.warning("smdebug: TensorBoard summary of %s skipped: %s: %s", name, type(exc).__name__, exc)


def summary_given(hook, summary: bytes, step: int, mode) -> bool:
    """A serialized Summary for the hook's TensorBoard run (BaseHook.write_summary); False when the hook
    exports no TensorBoard summaries."""
    exporter = _exporter(hook)
    if exporter is None:
        return False
    exporter.put(("summary", to_mode(mode), "", bytes(summary), int(step), time.time()))
    return True


def step_end(hook):
    exporter = _exporters.get(hook)
    if exporter is not None:
        exporter.put(("flush",))


def hook_closed(hook):
    exporter = _exporters.pop(hook, None)
    if exporter is not None:
        exporter.close()


# ---------------------------------------------------------------------------------------------------
# Export of a saved run


def export_tensorboard(trial, logdir: str, *, worker: str | None = None, progress=None) -> dict[str, int]:
    """Write TensorBoard summaries of a saved run (a Trial or its path) under logdir, one folder per mode.

    Uses the same tags as the hook's live export (see the module docstring); steps are global steps.
    ``worker`` picks whose values to export (default: the first worker of each step). ``progress``,
    if given, is called with each tensor name as it is exported. Returns the number of scalar and
    histogram events written, as ``{"scalars": n, "histograms": m, "damaged": k}``: a damaged record
    (truncated, failing its checksum; the reader warns of each) is skipped and counted in ``damaged``, and
    everything intact is exported.
    """
    from smdebug.trials import create_trial

    if isinstance(trial, (str, os.PathLike)):
        trial = create_trial(os.fspath(trial))
    logdir = os.fspath(logdir)  # a pathlib.Path too
    if worker is not None:  # (a TensorFlow device also in its file-name form)
        worker = layout.worker_from_file_name(worker)
    collections = list(trial.collections().values())
    colls_of: dict[str, list[Collection]] = {}
    counts = {"scalars": 0, "histograms": 0, "damaged": 0}
    writers: dict[ModeKeys, SummaryWriter] = {}
    try:
        # Step by step, so that each file's events come in step order as TensorBoard expects.
        for step in trial.steps():
            mode = trial.mode(step)
            for name in trial.tensor_names(step=step):
                if name not in colls_of:
                    colls_of[name] = [c for c in collections if c.matches(name)]
                    if progress is not None:
                        progress(name)
                tensor = trial.tensor(name)
                if worker is not None and worker not in tensor.workers(step):
                    continue  # a tensor only another worker saved (a loss only the first replica saves)
                data = tensor._worker_data(step, ModeKeys.GLOBAL, worker)
                items = []
                try:
                    if data.location is not None:
                        value = tensor.value(step, worker=worker)
                        items += [
                            (kind, tag, value) for kind, tag in summaries_for(name, value, colls_of[name])
                        ]
                except CorruptTensorRecord:
                    counts["damaged"] += 1
                for reduction, absolute in sorted(data.reductions):
                    stored = f"{REDUCTIONS_PREFIX}{'abs_' if absolute else ''}{reduction}/{name}"
                    try:
                        value = np.asarray(
                            tensor.reduction_value(step, reduction, worker=worker, abs=absolute)
                        )
                    except CorruptTensorRecord:
                        counts["damaged"] += 1
                        continue
                    items.append(("scalar", stored, value))
                if not items:
                    continue
                writer = writers.get(mode)
                if writer is None:
                    who = layout.worker_in_file_name(worker or trial.workers()[0])  # (a TF device has /)
                    writer = writers[mode] = SummaryWriter(logdir, mode, who, step, unique=False)
                for kind, tag, value in items:
                    if kind == "scalar":
                        writer.add_scalar(tag, value, step)
                        counts["scalars"] += 1
                    elif writer.add_histogram(tag, value, step):
                        counts["histograms"] += 1
    finally:
        for writer in writers.values():
            writer.close()
    return counts
