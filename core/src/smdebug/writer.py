"""Off-thread writing of steps in smdebug's layout.

The training thread only queues host numpy arrays and never waits on storage. Two background threads do
the rest: the encoder turns queued arrays into a step's files (staged locally: a temp file beside the
destination, or a spooled buffer for a remote store), and the publisher sends finished steps to the store
in order. The queue is bounded in bytes; it drains into local staging whatever the store does, so the
training thread only waits when it produces faster than encoding (nothing is dropped).

Each step's event file is published whole, then its index file: a reader never sees half a step, and a
process killed mid-step leaves nothing a reader would look at. When the store fails (an S3 outage),
finished steps wait in an ordered outbox, spilled to local disk, and are retried with backoff while
training goes on. ``close()`` returns within its timeout whatever the store does; the steps still unsaved
then are reported step by step and recorded in the run (``unsaved_steps/<worker>.json``) before its
end-of-job marker, so a run that lost steps never looks complete.

Before anything else the writer claims its worker name in the run (``writers/<worker>.json``, created
exclusively): a second writer of the same worker in one out_dir writes nothing.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from smdebug import codec, layout
from smdebug.exceptions import OutDirExistsError
from smdebug.layout import (  # noqa: F401 (END_OF_JOB_FILE, existing_run: still imported from here)
    END_OF_JOB_FILE,
    collections_file_path,
    event_file_path,
    existing_run,
    index_file_path,
)
from smdebug.modes import ModeKeys
from smdebug.store import StagedFile, Store, redact

logger = logging.getLogger("smdebug")

DEFAULT_MAX_QUEUE_BYTES = 256 * 1024 * 1024
DEFAULT_CLOSE_TIMEOUT = 60.0  # seconds close() keeps retrying a failing store before giving up
DEFAULT_CHECK_TIMEOUT = 5.0  # seconds a new hook waits for the out_dir check before training goes on
BATCH_BYTES = 1024 * 1024  # a step's tensors reach the encoder thread together below this size
RESERVE_BYTES = 1024 * 1024  # a tensor this large is copied for the writer only once the queue has room
SCALAR_BYTES = 256  # what a tensor's reductions count in the queue (encoded: a few small records)
RETRY_FIRST, RETRY_MAX = 0.25, 8.0  # backoff between retries of a failing store, in seconds
CLOSE_RETRY_MAX = 2.0  # backoff cap while close() drains
# Environment variables of launchers that start several workers (each then names itself by its rank,
# possibly only once its framework's distributed setup is done).
_WORLD_SIZE_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "DMLC_NUM_WORKER")


def max_queue_bytes_from_env() -> int:
    raw = os.environ.get("SMDEBUG_MAX_QUEUE_BYTES")
    return int(raw) if raw else DEFAULT_MAX_QUEUE_BYTES


def close_timeout_from_env() -> float:
    raw = os.environ.get("SMDEBUG_CLOSE_TIMEOUT")
    return float(raw) if raw else DEFAULT_CLOSE_TIMEOUT


def check_timeout_from_env() -> float:
    raw = os.environ.get("SMDEBUG_CHECK_TIMEOUT")
    return float(raw) if raw else DEFAULT_CHECK_TIMEOUT


def one_of_many_workers() -> bool:
    """Whether a launcher started this process as one of several workers (torchrun, mpirun, ...)."""
    for name in _WORLD_SIZE_ENV:
        try:
            if int(os.environ.get(name, "1")) > 1:
                return True
        except ValueError:
            pass
    return False


def at_exit(fn, *args) -> None:
    """Run fn(*args) at interpreter exit, before thread pools shut down (s3fs needs them to upload)."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError
        register(fn, *args)
    except RuntimeError:  # no such hook, or the interpreter is already shutting down
        atexit.register(fn, *args)


def run_bounded(fn: Callable[[], object], timeout: float | None = None) -> None:
    """Run fn on a thread of its own and wait for it at most ``timeout`` seconds (default the close
    timeout): for a storage call made from the training thread. Its errors are raised here."""
    errors: list[BaseException] = []

    def call():
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=call, name="smdebug-storage-call", daemon=True)
    thread.start()
    timeout = close_timeout_from_env() if timeout is None else timeout
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"the store did not answer within {timeout:g} s")
    if errors:
        raise errors[0]


def format_steps(steps) -> str:
    return ", ".join(str(s) for s in sorted(steps))


def unsaved_report(failed_steps: dict[int, str], failed_files: dict[str, str]) -> str:
    """Which steps and files could not be saved, and why (steps grouped by reason); empty when none."""
    by_reason: dict[str, list] = {}
    for step, why in sorted(failed_steps.items()):
        by_reason.setdefault(why, []).append(step)
    parts = []
    if failed_steps:
        groups = "; ".join(f"{format_steps(steps)} ({why})" for why, steps in by_reason.items())
        parts.append(f"{len(failed_steps)} step(s) could not be saved: {groups}")
    if failed_files:
        files = ", ".join(f"{f} ({why})" for f, why in sorted(failed_files.items()))
        parts.append(f"file(s) could not be saved: {files}")
    return "; ".join(parts)


# -- claiming a worker's name in a run ------------------------------------------------------------------
def claim_worker(store: Store, worker: str, token: str) -> str | None:
    """Claim ``worker`` in the run of ``store``; None when it is ours (now, or by an earlier call with the
    same token), else what holds it. The claim file is created exclusively, so of two writers starting
    together exactly one gets it (atomic locally and on S3; see Store.create_exclusive)."""
    relpath = layout.writer_claim_path(worker)
    claim = {"worker": worker, "token": token, "host": socket.gethostname(), "pid": os.getpid()}
    claim["started"] = time.time()
    try:
        store.create_exclusive(relpath, json.dumps(claim).encode())
        return None
    except FileExistsError:
        pass
    try:
        other = json.loads(store.read_bytes(relpath))
    except (OSError, ValueError):
        other = {}  # being written by its owner right now
    if not isinstance(other, dict):
        other = {}
    if other.get("token") == token:
        return None
    who = f"host {other.get('host', '?')}, pid {other.get('pid', '?')}"
    return f"a run being written by another writer of {worker} ({who}: {relpath} is there)"


def release_worker(store: Store, worker: str, token: str, prune: tuple[str, ...] = ()) -> None:
    """Drop our claim of ``worker``: made under a name the process turned out not to have, or no longer
    needed (the run is finished, and its end-of-job marker protects it). ``prune``: local folders
    (relative, "" the run itself) to remove too if that left them empty."""
    relpath = layout.writer_claim_path(worker)
    try:
        if json.loads(store.read_bytes(relpath)).get("token") == token:
            store.remove(relpath)
    except (OSError, ValueError, AttributeError):
        pass
    if store.is_local:
        for folder in (layout.WRITERS_DIR, *prune):
            try:
                os.rmdir(f"{store.root}/{folder}" if folder else store.root)
            except OSError:  # not empty, or not there
                pass


class OutDirCheck:
    """The check of an out_dir (an earlier run, another writer of this worker) and the claim of the
    worker's name, made on a thread of its own when a hook is created: the hook waits for it at most a
    few seconds, so an unreachable store never holds training up. When it does not finish in time, the
    writer makes the claim before it writes anything (and writes nothing if the name is taken)."""

    def __init__(self, open_store: Callable[[], Store], worker: str | None, claim: bool):
        self.worker = worker
        self.token = uuid.uuid4().hex
        self.store: Store | None = None
        self.found: str | None = None  # what the out_dir already holds that refuses this hook
        self.claimed = False
        self.in_use = False  # a writer took the claim over
        self.created_run = False  # the claim created the (local) run folder
        self.error: BaseException | None = None
        self._open_store = open_store
        self._claim = claim and worker is not None
        self._done = threading.Event()
        threading.Thread(target=self._run, name="smdebug-out-dir-check", daemon=True).start()

    def _run(self) -> None:
        try:
            self.store = self._open_store()
            self.found = existing_run(self.store, self.worker)
            if self.found is None and self._claim:
                self.created_run = self.store.is_local and not os.path.isdir(self.store.root)
                self.found = claim_worker(self.store, self.worker, self.token)
                self.claimed = self.found is None
        except Exception as exc:  # an unreachable location: the writer claims the run when it can
            self.error = exc
        finally:
            self._done.set()

    def wait(self, timeout: float) -> bool:
        """Whether the check finished within ``timeout`` seconds."""
        return self._done.wait(timeout)

    def release_if_unused(self) -> None:
        """A hook that never wrote leaves nothing behind: its claim goes (and the run folder the claim
        created). Bounded: at most the check timeout."""
        if not self.claimed or self.in_use or not self._done.is_set():
            return
        self.claimed = False
        prune = ("",) if self.created_run else ()
        try:
            run_bounded(
                lambda: release_worker(self.store, self.worker, self.token, prune), check_timeout_from_env()
            )
        except Exception as exc:
            logger.debug("smdebug: could not release the claim of %s: %s", self.worker, exc)


class WorkerClaimed(OutDirExistsError):
    """Another writer holds this worker's name in the run (found by the writer, after the hook started)."""


# -- what the publisher sends -------------------------------------------------------------------------
@dataclass
class _OpenStep:
    step: int
    mode: ModeKeys
    mode_step: int
    staged: StagedFile | None = None
    tensors: list = field(default_factory=list)
    shapes: list = field(default_factory=list)
    failed: bool = False


class _Publication:
    """Files to publish in order (a step's event file then its index, or one metadata file)."""

    def __init__(self, step: int | None, parts: list):
        self.step = step
        self.parts = parts  # StagedFile, or (relpath, bytes)
        self.file = None if step is not None else parts[0][0]
        self.memory = 0  # what it counted for in the outbox's memory budget

    @property
    def what(self) -> str:
        return f"step {self.step}" if self.step is not None else f"file {self.file}"

    def publish(self, store: Store) -> None:
        while self.parts:  # parts already published are not sent again on a retry
            part = self.parts[0]
            if isinstance(part, StagedFile):
                part.commit()
            else:
                store.write_bytes(*part)
            self.parts.pop(0)

    def in_memory(self) -> int:
        return sum(p.in_memory if isinstance(p, StagedFile) else len(p[1]) for p in self.parts)

    def spill(self) -> None:
        for p in self.parts:
            if isinstance(p, StagedFile):
                p.spill()

    def discard(self) -> None:
        for p in self.parts:
            if isinstance(p, StagedFile):
                p.discard()
        self.parts = []


class _Claim:
    """The claim of the writer's worker name, published before anything else."""

    step = None
    file = None
    memory = 0

    def __init__(self, worker: str, token: str, release: str | None = None):
        self.worker, self.token, self.release = worker, token, release
        self.what = f"the claim of {worker}"

    def publish(self, store: Store) -> None:
        if self.release and self.release != self.worker:
            release_worker(store, self.release, self.token)
        found = existing_run(store, self.worker) or claim_worker(store, self.worker, self.token)
        if found:
            raise WorkerClaimed(found)

    def in_memory(self) -> int:
        return 0

    def spill(self) -> None:
        pass

    def discard(self) -> None:
        pass


class RunWriter:
    """Writes the steps of one worker to a Store from background threads.

    ``store`` is a Store, or a callable that opens one (called on the writer's thread: opening a remote
    store may wait on the network). ``claim=(token, released_worker or None)`` makes the writer claim its
    worker name before writing anything."""

    takes_views = False  # write_tensor keeps the array it is given: the caller passes a copy

    def __init__(
        self,
        store: Store | Callable[[], Store],
        worker: str,
        max_queue_bytes: int | None = None,
        close_timeout: float | None = None,
        *,
        uri: str | None = None,
        claim: tuple[str, str | None] | None = None,
        claim_token: str | None = None,
    ):
        self.store: Store | None = store if isinstance(store, Store) else None
        self._opener = None if self.store is not None else store
        self.uri = self.store.uri if self.store is not None else redact(uri or "?")
        self.worker = worker
        self.max_queue_bytes = max_queue_bytes or max_queue_bytes_from_env()
        self.close_timeout = close_timeout_from_env() if close_timeout is None else close_timeout
        self.failed_steps: dict[int, str] = {}  # steps that will never be saved -> why
        self.failed_files: dict[str, str] = {}
        self.written_steps: list[int] = []
        self.refused: str | None = None  # why this writer writes nothing at all
        self._queue: queue.Queue = queue.Queue()
        # A step's items go to the encoder thread together at its end (each put wakes that thread, which
        # then competes with training for the GIL): the batch and what it holds in bytes.
        self._batch: list = []
        self._batch_bytes = 0
        self._queued_bytes = 0
        self._step_has_data = False  # anything queued for the step that end_step will finish
        self._submitted: set[int] = set()  # steps the training thread gave data to
        self._room = threading.Condition()
        self._open: _OpenStep | None = None
        self._ended: _OpenStep | None = None  # the last step written (its records, not its bytes)
        # the publisher's state, guarded by _lock
        self._lock = threading.Condition()
        self._outbox: collections.deque = collections.deque()
        self._outbox_memory = 0
        self._publishing = None  # the publication being sent right now
        self._failing = False  # the last attempt failed: the outbox waits for a retry
        self._retry_at = 0.0
        self._backoff = RETRY_FIRST
        self._last_error = ""
        self._store_ready = threading.Event()
        self._encoded_all = False  # the encoder has handed over everything queued before close
        self._drain_deadline: float | None = None
        self._end_of_job = False
        self._abandoned = False
        self._closed = False
        # the token of this worker's claim in the run, dropped once the end-of-job marker is written
        self._claim_token = claim[0] if claim is not None else claim_token
        if claim is not None:
            self._outbox.append(_Claim(worker, *claim))
        self._thread = threading.Thread(target=self._run, name=f"smdebug-writer-{worker}", daemon=True)
        self._publisher = threading.Thread(
            target=self._publish_loop, name=f"smdebug-publisher-{worker}", daemon=True
        )
        self._thread.start()
        self._publisher.start()

    # -- training thread ----------------------------------------------------------------------------
    def write_tensor(
        self,
        step: int,
        mode: ModeKeys,
        mode_step: int,
        name: str,
        array: np.ndarray,
        wall_time=None,
        reserved: int = 0,
    ) -> None:
        """Queue a tensor of a step; wall_time (seconds since the epoch) defaults to now. ``reserved``:
        bytes the caller already counted in the queue with ``reserve`` (before copying the tensor)."""
        nbytes = int(array.nbytes)
        if reserved:
            with self._room:
                self._queued_bytes += nbytes - reserved
        else:
            self.reserve(nbytes)
        self._step_has_data = True
        self._submitted.add(step)
        wall_time = time.time() if wall_time is None else wall_time
        self._batch.append(("tensor", step, mode, mode_step, name, array, wall_time, nbytes))
        self._batch_bytes += nbytes
        if self._batch_bytes >= BATCH_BYTES:  # large tensors go at once: the encoder overlaps the step
            self._send_batch()

    def write_scalars(
        self, step: int, mode: ModeKeys, mode_step: int, names: list[list[str]], values: list, wall_time
    ) -> None:
        """Queue a step's reductions as one item: ``values[i]``, a 1-d host array, holds the 0-d tensors
        named ``names[i]`` (encoded together on the writer's thread)."""
        nbytes = SCALAR_BYTES * len(values)
        self.reserve(nbytes)
        self._step_has_data = True
        self._submitted.add(step)
        self._batch.append(("scalars", step, mode, mode_step, names, values, wall_time, nbytes))
        self._batch_bytes += nbytes

    def reserve(self, nbytes: int) -> None:
        """Wait until the queue has room for ``nbytes`` more and count them in it (write_tensor does;
        a caller that copies a tensor for the writer waits before copying, so that the copy is within the
        bound, then passes ``reserved=nbytes``). One item is always admitted into an empty queue however
        large it is."""
        with self._room:
            while self._queued_bytes and self._queued_bytes + nbytes > self.max_queue_bytes:
                if self._batch:
                    self._send_batch()  # the encoder frees room only for what it has been given
                self._room.wait()
            self._queued_bytes += nbytes

    def _send_batch(self) -> None:
        if self._batch:
            batch, self._batch, self._batch_bytes = self._batch, [], 0
            self._queue.put(("batch", batch))

    def write_shape(self, step: int, mode: ModeKeys, mode_step: int, name: str, shape) -> None:
        self._step_has_data = True
        self._submitted.add(step)
        self._batch.append(("shape", step, mode, mode_step, name, list(shape)))

    def end_step(self, step: int) -> None:
        # A step that saved nothing has nothing to finish: waking the writer thread for it at every
        # step costs the training thread more than the rest of an idle step's hook work.
        if self._step_has_data:
            self._step_has_data = False
            self._batch.append(("end", step))
        self._send_batch()

    def write_file(self, relpath: str, data: bytes) -> None:
        self._send_batch()
        self._queue.put(("file", relpath, data))

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    @property
    def pending_steps(self) -> list[int]:
        """Finished steps waiting for the store to come back."""
        with self._lock:
            return [p.step for p in self._outbox if p.step is not None]

    @property
    def failing(self) -> bool:
        """Whether the store is failing (steps wait in the outbox for a retry)."""
        return self._failing

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far has been handled: written, or waiting for a failing store
        to come back. Waits at most ``timeout`` seconds (default ``close_timeout``); False if it had to
        stop waiting."""
        if self._closed:
            return True
        timeout = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        done = threading.Event()
        self._send_batch()
        self._queue.put(("flush", done))
        while not done.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
            if not self._thread.is_alive() or time.monotonic() >= deadline:
                return False
        with self._lock:
            while self._outbox and not (self._failing and self._publishing is None) and not self.refused:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._publisher.is_alive():
                    return False
                self._lock.wait(remaining)
        return True

    def close(
        self, timeout: float | None = None, end_of_job: bool = False, finish_open_step: bool = True
    ) -> dict[int, str]:
        """Write everything queued, retrying a failing store, and stop; returns within ``timeout``
        seconds (default ``close_timeout``) whatever the store does, with the steps that were not saved.
        With ``end_of_job`` the run's end-of-job marker is written last, after the record of any steps
        that could not be saved (and not at all when that record cannot be written). Without
        ``finish_open_step`` a step whose end was not queued is dropped (its process died mid-step)."""
        if self._closed:
            return self.failed_steps
        self._closed = True
        timeout = self.close_timeout if timeout is None else timeout
        start = time.monotonic()
        deadline = start + timeout
        with self._lock:
            # a short reserve at the end for the record of unsaved steps and the end-of-job marker
            self._drain_deadline = deadline - min(1.0, timeout / 4)
            self._end_of_job = end_of_job
            self._lock.notify_all()
        self._send_batch()
        self._queue.put(("stop", finish_open_step))
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._publisher.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive() or self._publisher.is_alive():
            self._abandon(timeout)  # a request that hangs: stop waiting for it
        return self.failed_steps

    def unsaved_report(self) -> str:
        """Which steps and files could not be saved, and why (grouped by reason); empty when all were."""
        return unsaved_report(self.failed_steps, self.failed_files)

    def _abandon(self, timeout: float) -> None:
        """close() timed out on a request that does not return: whatever is not confirmed written by now
        is reported unsaved, and the threads write nothing more."""
        with self._lock:
            self._abandoned = True
            why = f"not written within the close timeout ({timeout:g} s)"
            if self._last_error:
                why += f"; last error: {self._last_error}"
            written = set(self.written_steps)
            for step in sorted(self._submitted - written):
                self.failed_steps.setdefault(step, why)
            for pub in self._outbox:
                if pub.file is not None:
                    self.failed_files.setdefault(pub.file, why)
                if pub is not self._publishing:  # its temp files go now, not at interpreter exit
                    pub.discard()
            if self._end_of_job and not self._end_written:
                self.failed_files.setdefault(END_OF_JOB_FILE, why)
            self._lock.notify_all()
        logger.warning("smdebug: %s did not answer within the close timeout (%g s)", self.uri, timeout)

    _end_written = False

    # -- encoder thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        if self.store is None:
            try:
                self.store = self._opener()
            except Exception as exc:
                reason = redact(f"{type(exc).__name__}: {exc}")
                self.refused = f"cannot open {self.uri}: {reason}"
                logger.warning("smdebug: nothing is saved: %s", self.refused)
        self._store_ready.set()
        batch: collections.deque = collections.deque()
        while True:
            item = batch.popleft() if batch else self._queue.get()
            kind = item[0]
            if kind == "batch":
                batch.extend(item[1])
                continue
            try:
                if self._abandoned and kind in ("tensor", "scalars", "shape", "end", "file"):
                    pass  # close() gave up on a store that hangs: nothing more is written
                elif kind == "tensor":
                    self._tensor(*item[1:7])
                elif kind == "scalars":
                    self._scalars(*item[1:7])
                elif kind == "shape":
                    self._shape(*item[1:])
                elif kind == "end":
                    self._finish(item[1])
                elif kind == "file":
                    self._publish(_Publication(None, [(item[1], item[2])]))
                elif kind == "flush":
                    item[1].set()
                elif kind == "stop":
                    if self._open is not None and item[1]:
                        self._finish(self._open.step)
                    elif self._open is not None and self._open.staged is not None:
                        self._open.staged.discard()
                    return
            except Exception as exc:  # the writer thread must survive anything
                logger.warning("smdebug: writer error: %s", self._describe(exc))
            finally:
                if kind in ("tensor", "scalars"):
                    with self._room:
                        self._queued_bytes -= item[7]
                        self._room.notify_all()
                if kind == "stop":
                    with self._lock:
                        self._encoded_all = True
                        self._lock.notify_all()

    def _describe(self, exc: BaseException) -> str:
        if self.store is not None:
            return self.store.describe(exc)
        return redact(f"{type(exc).__name__}: {exc}")

    def _step(self, step: int, mode: ModeKeys, mode_step: int) -> _OpenStep:
        if self._open is not None and self._open.step != step:
            self._finish(self._open.step)
        if self._open is None:
            ended = self._ended
            if ended is not None and ended.step == step and not ended.failed:
                self._open = self._reopen(ended)
            else:
                self._open = _OpenStep(step, mode, mode_step)
                if self.refused:
                    self._open.failed = True
                    self.failed_steps[step] = self.refused
        return self._open

    def _reopen(self, ended: _OpenStep) -> _OpenStep:
        """More tensors for a step that already ended (save_scalar after training): the step's files are
        published again whole, earlier records first, so nothing saved in it before is lost."""
        st = _OpenStep(ended.step, ended.mode, ended.mode_step, None, list(ended.tensors), list(ended.shapes))
        if not ended.tensors:
            return st
        with self._lock:
            while True:  # not while the publisher is sending it: wait for that attempt to end
                waiting = next((p for p in self._outbox if p.step == st.step), None)
                if waiting is None or waiting is not self._publishing or self._abandoned:
                    break
                self._lock.wait(1.0)
            if waiting is not None and waiting.parts and isinstance(waiting.parts[0], StagedFile):
                self._outbox.remove(waiting)  # not yet published: append to the staged file itself
                self._outbox_memory -= waiting.memory
                st.staged = waiting.parts[0]
                st.staged.resume()
                return st
        try:
            st.staged = self.store.stage(event_file_path(st.step, self.worker))
            st.staged.write(self.store.read_bytes(event_file_path(st.step, self.worker)))
        except Exception as exc:
            self._fail(st, exc)
        return st

    def _fail(self, st: _OpenStep, exc: BaseException) -> None:
        reason = self._describe(exc)
        if not st.failed:
            logger.warning("smdebug: could not save step %d to %s: %s", st.step, self.uri, reason)
        st.failed = True
        self.failed_steps[st.step] = reason
        if st.staged is not None:
            st.staged.discard()
            st.staged = None

    def _tensor(self, step, mode, mode_step, name, array, wall_time) -> None:
        st = self._step(step, mode, mode_step)
        if st.failed:
            return
        try:
            # smdebug 1.0's reader insists on its "no checksum" footer in tensor event files, so the
            # payload's CRC goes in the index entry instead (smdebug 1.0 ignores keys it does not know).
            # The record stays in chunks, a large tensor's content a view of the array: no copy of it.
            event = codec.tensor_event_chunks(name, array, step, wall_time, mode.value, mode_step)
            record, size, crc = codec.frame_chunks(event, checksum=False)
        except Exception as exc:  # one unencodable tensor does not lose its step
            logger.warning("smdebug: could not encode %s at step %d: %s", name, step, self._describe(exc))
            return
        offset = self._append(st, record)
        if offset is not None:
            st.tensors.append(layout.tensor_entry(name, offset, size, crc))

    def _scalars(self, step, mode, mode_step, names, values, wall_time) -> None:
        st = self._step(step, mode, mode_step)
        if st.failed:
            return
        try:
            data, records = codec.scalar_records(names, values, step, wall_time, mode.value, mode_step)
        except Exception as exc:  # one by one: only what cannot be encoded is lost
            logger.debug("smdebug: encoding reductions together failed (%s); one by one", exc)
            for some, array in zip(names, values):
                for name, value in zip(some, array):
                    self._tensor(step, mode, mode_step, name, np.asarray(value), wall_time)
            return
        offset = self._append(st, [data])
        if offset is not None:
            entry = layout.tensor_entry
            st.tensors.extend(entry(name, offset + start, size, crc) for name, start, size, crc in records)

    def _append(self, st: _OpenStep, chunks: list) -> int | None:
        """Write chunks at the end of the step's event file: their offset in it, or None when that fails
        (the step is then recorded as not saved)."""
        try:
            if st.staged is None:
                st.staged = self.store.stage(event_file_path(st.step, self.worker))
            offset = st.staged.size
            for chunk in chunks:
                st.staged.write(chunk)
        except Exception as exc:
            self._fail(st, exc)
            return None
        return offset

    def _shape(self, step, mode, mode_step, name, shape) -> None:
        st = self._step(step, mode, mode_step)
        st.shapes.append(layout.shape_entry(name, shape))

    def _finish(self, step: int) -> None:
        st = self._open
        if st is None or st.step != step:
            return
        self._open = None
        self._ended = st
        if st.failed or not (st.tensors or st.shapes):
            if st.staged is not None:
                st.staged.discard()
            return
        index = layout.encode_index(
            st.mode.name, st.mode_step, event_file_path(step, self.worker), st.tensors, st.shapes
        )
        parts = [st.staged] if st.staged is not None else []
        st.staged = None  # the publication owns it now
        parts.append((index_file_path(step, self.worker), index))
        self._publish(_Publication(step, parts))

    def _publish(self, pub: _Publication) -> None:
        """Hand a finished step or file to the publisher (in order: a live reader must never see step
        n+1 before step n)."""
        if self.refused:
            self._given_up(pub, self.refused, quiet=True)
            return
        memory = pub.in_memory()
        # Waiting steps go to local disk beyond a small memory budget (spilled before the publisher
        # can see them, so never while it reads them).
        if self._outbox_memory + memory > min(self.max_queue_bytes, 64 * 1024 * 1024):
            pub.spill()
            memory = pub.in_memory()
        with self._lock:
            pub.memory = memory
            self._outbox_memory += memory
            self._outbox.append(pub)
            self._lock.notify_all()

    # -- publisher thread ---------------------------------------------------------------------------
    def _publish_loop(self) -> None:
        self._store_ready.wait()
        while True:
            pub = self._next()
            if pub is None:
                break
            try:
                pub.publish(self.store)
            except Exception as exc:
                self._attempt_failed(pub, exc)
            else:
                self._attempt_succeeded(pub)
        self._finish_close()

    def _next(self):
        """The publication to send now (waiting out the backoff of a failing store); None to stop."""
        with self._lock:
            while True:
                if self._abandoned:
                    return None
                if self.refused:
                    self._refuse_outbox()
                now = time.monotonic()
                draining = self._drain_deadline is not None and self._encoded_all
                if draining and (not self._outbox or now >= self._drain_deadline):
                    return None
                if self._outbox and (not self._failing or now >= self._retry_at):
                    self._publishing = self._outbox[0]
                    return self._publishing
                timeout = self._retry_at - now if self._outbox else None
                if self._drain_deadline is not None:
                    left = self._drain_deadline - now
                    timeout = left if timeout is None else min(timeout, left)
                    timeout = max(timeout, 0.01)
                self._lock.wait(timeout)

    def _transient(self, exc: BaseException) -> bool:
        """Whether a failed write is worth retrying: anything from a remote store (while a server comes
        back it may answer "no such bucket" or "access denied" too), nothing from a local disk."""
        if isinstance(exc, OutDirExistsError):
            return False
        return not self.store.is_local and not isinstance(exc, (ValueError, TypeError))

    def _attempt_failed(self, pub, exc: BaseException) -> None:
        reason = self._describe(exc)
        with self._lock:
            self._publishing = None
            self._last_error = reason
            if self._abandoned:
                return
            if isinstance(exc, OutDirExistsError):
                self.refused = f"out_dir {self.uri} already holds {exc}"
                logger.error(
                    "smdebug: nothing is saved: %s already holds %s; smdebug does not mix two runs in one "
                    "directory: choose a new out_dir",
                    self.uri,
                    exc,
                )
                self._refuse_outbox()
            elif not self._transient(exc):
                self._pop(pub)
                self._given_up(pub, reason)
            else:
                if not self._failing:
                    logger.warning(
                        "smdebug: could not write %s to %s: %s; retrying in the background while training "
                        "goes on",
                        pub.what,
                        self.uri,
                        reason,
                    )
                    self._backoff = RETRY_FIRST
                else:
                    cap = CLOSE_RETRY_MAX if self._drain_deadline is not None else RETRY_MAX
                    self._backoff = min(self._backoff * 2, cap)
                    logger.debug("smdebug: retry of %s failed: %s", pub.what, reason)
                self._failing = True
                self._retry_at = time.monotonic() + self._backoff
            self._lock.notify_all()

    def _attempt_succeeded(self, pub) -> None:
        with self._lock:
            self._publishing = None
            if self._abandoned and pub.step is not None and pub.step in self.failed_steps:
                # close() already reported this step unsaved (the request outlived its timeout): take it
                # out of the run again, so that the run and the report agree
                undo = True
            else:
                undo = False
                self._pop(pub)
        if undo:
            for relpath in (index_file_path(pub.step, self.worker), event_file_path(pub.step, self.worker)):
                try:
                    self.store.remove(relpath)
                except Exception as exc:
                    logger.debug("smdebug: could not remove %s: %s", relpath, self._describe(exc))
            return
        with self._lock:
            if pub.step is not None:
                self.written_steps.append(pub.step)
            if self._failing:
                self._failing = False
                self._backoff = RETRY_FIRST
                logger.warning(
                    "smdebug: %s is reachable again; writing %d waiting item(s)",
                    self.uri,
                    len(self._outbox) + 1,
                )
            self._lock.notify_all()

    def _pop(self, pub) -> None:
        if self._outbox and self._outbox[0] is pub:
            self._outbox.popleft()
            self._outbox_memory -= pub.memory

    def _refuse_outbox(self) -> None:
        while self._outbox:
            self._given_up(self._outbox.popleft(), self.refused, quiet=True)
        self._outbox_memory = 0

    def _given_up(self, pub, reason: str, quiet: bool = False) -> None:
        if not quiet:
            logger.warning("smdebug: could not save %s to %s: %s", pub.what, self.uri, reason)
        if pub.step is not None:
            self.failed_steps[pub.step] = reason
        elif pub.file is not None:
            self.failed_files[pub.file] = reason
        pub.discard()

    def _finish_close(self) -> None:
        """At close, past the drain: what is still waiting is unsaved; then the record of the unsaved
        steps and the end-of-job marker, in that order, unless the store is still failing."""
        with self._lock:
            if self._abandoned:
                return
            why = self._last_error or "not written before the close timeout"
            while self._outbox:
                self._given_up(self._outbox.popleft(), why, quiet=True)
            self._outbox_memory = 0
            end_of_job, failing, refused = self._end_of_job, self._failing, self.refused
        if refused or self.store is None:
            return
        final = []
        if self.failed_steps or self.failed_files:
            record = layout.encode_unsaved(self.worker, self.failed_steps, self.failed_files)
            final.append((layout.unsaved_steps_path(self.worker), record))
        if end_of_job:
            final.append((END_OF_JOB_FILE, b""))
        for relpath, data in final:
            if failing:  # the store did not come back: no point waiting on it again
                self.failed_files[relpath] = why
                continue
            try:
                if self._abandoned:
                    return
                self.store.write_bytes(relpath, data)
                if relpath == END_OF_JOB_FILE:
                    self._end_written = True
                    # a finished run is protected by its marker: the claim goes, and the run holds
                    # exactly smdebug 1.0's files
                    if self._claim_token:
                        release_worker(self.store, self.worker, self._claim_token)
            except Exception as exc:
                failing = True  # without the record of unsaved steps, the run must not look complete
                why = self._describe(exc)
                self.failed_files[relpath] = why
