"""Off-thread writing of steps in smdebug's layout.

The training thread only queues host numpy arrays; encoding and I/O happen on one background thread.
The queue is bounded in bytes: when it is full the training thread waits, nothing is dropped.

Each step's event file is staged (a temp file beside it, or a spooled buffer for a remote store) and
published whole, then its index file: a reader never sees half a step, and a process killed mid-step
leaves nothing a reader would look at. When the store fails (an S3 outage), finished steps wait in an
ordered backlog, spilled to local disk, and are retried with backoff while training goes on; whatever
is still unsaved when ``close()`` gives up is reported step by step.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from smdebug import codec, layout
from smdebug.layout import (  # noqa: F401 (END_OF_JOB_FILE, existing_run: still imported from here)
    END_OF_JOB_FILE,
    collections_file_path,
    event_file_path,
    existing_run,
    index_file_path,
)
from smdebug.modes import ModeKeys
from smdebug.store import StagedFile, Store

logger = logging.getLogger("smdebug")

DEFAULT_MAX_QUEUE_BYTES = 256 * 1024 * 1024
DEFAULT_CLOSE_TIMEOUT = 60.0  # seconds close() keeps retrying a failing store before giving up
RETRY_FIRST, RETRY_MAX = 0.25, 8.0  # backoff between retries of a failing store, in seconds


def max_queue_bytes_from_env() -> int:
    raw = os.environ.get("SMDEBUG_MAX_QUEUE_BYTES")
    return int(raw) if raw else DEFAULT_MAX_QUEUE_BYTES


def close_timeout_from_env() -> float:
    raw = os.environ.get("SMDEBUG_CLOSE_TIMEOUT")
    return float(raw) if raw else DEFAULT_CLOSE_TIMEOUT


def at_exit(fn, *args) -> None:
    """Run fn(*args) at interpreter exit, before thread pools shut down (s3fs needs them to upload)."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError
        register(fn, *args)
    except RuntimeError:  # no such hook, or the interpreter is already shutting down
        atexit.register(fn, *args)


def format_steps(steps) -> str:
    return ", ".join(str(s) for s in sorted(steps))


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

    @property
    def what(self) -> str:
        return f"step {self.step}" if self.step is not None else f"file {self.parts[0][0]}"

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


class RunWriter:
    """Writes the steps of one worker to a Store from a background thread."""

    def __init__(
        self,
        store: Store,
        worker: str,
        max_queue_bytes: int | None = None,
        close_timeout: float | None = None,
    ):
        self.store = store
        self.worker = worker
        self.max_queue_bytes = max_queue_bytes or max_queue_bytes_from_env()
        self.close_timeout = close_timeout_from_env() if close_timeout is None else close_timeout
        self.failed_steps: dict[int, str] = {}  # steps that will never be saved -> why
        self.failed_files: dict[str, str] = {}
        self.written_steps: list[int] = []
        self._queue: queue.Queue = queue.Queue()
        self._queued_bytes = 0
        self._step_has_data = False  # anything queued for the step that end_step will finish
        self._room = threading.Condition()
        self._open: _OpenStep | None = None
        self._ended: _OpenStep | None = None  # the last step written (its records, not its bytes)
        self._backlog: collections.deque[_Publication] = collections.deque()
        self._retry_at = 0.0
        self._backoff = RETRY_FIRST
        self._last_error = ""
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"smdebug-writer-{worker}", daemon=True)
        self._thread.start()

    # -- training thread ----------------------------------------------------------------------------
    def write_tensor(
        self, step: int, mode: ModeKeys, mode_step: int, name: str, array: np.ndarray, wall_time=None
    ) -> None:
        """Queue a tensor of a step; wall_time (seconds since the epoch) defaults to now."""
        nbytes = int(array.nbytes)
        with self._room:
            # Wait for room, but always admit one item into an empty queue however large it is.
            while self._queued_bytes and self._queued_bytes + nbytes > self.max_queue_bytes:
                self._room.wait()
            self._queued_bytes += nbytes
        self._step_has_data = True
        wall_time = time.time() if wall_time is None else wall_time
        self._queue.put(("tensor", step, mode, mode_step, name, array, wall_time, nbytes))

    def write_shape(self, step: int, mode: ModeKeys, mode_step: int, name: str, shape) -> None:
        self._step_has_data = True
        self._queue.put(("shape", step, mode, mode_step, name, list(shape)))

    def end_step(self, step: int) -> None:
        # A step that saved nothing has nothing to finish: waking the writer thread for it at every
        # step costs the training thread more than the rest of an idle step's hook work.
        if self._step_has_data:
            self._step_has_data = False
            self._queue.put(("end", step))

    def write_file(self, relpath: str, data: bytes) -> None:
        self._queue.put(("file", relpath, data))

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    @property
    def pending_steps(self) -> list[int]:
        """Finished steps waiting for the store to come back."""
        return [p.step for p in list(self._backlog) if p.step is not None]

    def flush(self) -> None:
        """Wait until everything queued so far has been handled (written, or waiting in the backlog)."""
        if self._closed:
            return
        done = threading.Event()
        self._queue.put(("flush", done))
        while not done.wait(0.5):
            if not self._thread.is_alive():
                return

    def close(self, timeout: float | None = None) -> dict[int, str]:
        """Write everything queued, retrying a failing store for up to ``timeout`` seconds (default
        ``close_timeout``), and stop the thread; returns the steps that could not be saved."""
        if not self._closed:
            self._closed = True
            timeout = self.close_timeout if timeout is None else timeout
            self._queue.put(("stop", time.monotonic() + timeout))
            self._thread.join()
        return self.failed_steps

    def unsaved_report(self) -> str:
        """Which steps and files could not be saved, and why (grouped by reason); empty when all were."""
        by_reason: dict[str, list] = {}
        for step, why in sorted(self.failed_steps.items()):
            by_reason.setdefault(why, []).append(step)
        parts = []
        if self.failed_steps:
            groups = "; ".join(f"{format_steps(steps)} ({why})" for why, steps in by_reason.items())
            parts.append(f"{len(self.failed_steps)} step(s) could not be saved: {groups}")
        if self.failed_files:
            files = ", ".join(f"{f} ({why})" for f, why in sorted(self.failed_files.items()))
            parts.append(f"file(s) could not be saved: {files}")
        return "; ".join(parts)

    # -- writer thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            timeout = max(0.0, self._retry_at - time.monotonic()) if self._backlog else None
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                self._retry()
                continue
            kind = item[0]
            try:
                if kind == "tensor":
                    self._tensor(*item[1:7])
                elif kind == "shape":
                    self._shape(*item[1:])
                elif kind == "end":
                    self._finish(item[1])
                elif kind == "file":
                    self._publish(_Publication(None, [(item[1], item[2])]))
                elif kind == "flush":
                    item[1].set()
                elif kind == "stop":
                    if self._open is not None:
                        self._finish(self._open.step)
                    self._drain(item[1])
                    return
            except Exception as exc:  # the writer thread must survive anything
                logger.warning("smdebug: writer error: %s", self.store.describe(exc))
            finally:
                if kind == "tensor":
                    with self._room:
                        self._queued_bytes -= item[7]
                        self._room.notify_all()
            if self._backlog and time.monotonic() >= self._retry_at:
                self._retry()

    def _step(self, step: int, mode: ModeKeys, mode_step: int) -> _OpenStep:
        if self._open is not None and self._open.step != step:
            self._finish(self._open.step)
        if self._open is None:
            ended = self._ended
            if ended is not None and ended.step == step and not ended.failed:
                self._open = self._reopen(ended)
            else:
                self._open = _OpenStep(step, mode, mode_step)
        return self._open

    def _reopen(self, ended: _OpenStep) -> _OpenStep:
        """More tensors for a step that already ended (save_scalar after training): the step's files are
        published again whole, earlier records first, so nothing saved in it before is lost."""
        st = _OpenStep(ended.step, ended.mode, ended.mode_step, None, list(ended.tensors), list(ended.shapes))
        if not ended.tensors:
            return st
        waiting = next((p for p in self._backlog if p.step == st.step), None)
        try:
            if waiting is not None and isinstance(waiting.parts[0], StagedFile):
                # not yet published (the store is failing): append to the staged file itself
                self._backlog.remove(waiting)
                st.staged = waiting.parts[0]
                st.staged.resume()
            else:
                st.staged = self.store.stage(event_file_path(st.step, self.worker))
                st.staged.write(self.store.read_bytes(event_file_path(st.step, self.worker)))
        except Exception as exc:
            self._fail(st, exc)
        return st

    def _fail(self, st: _OpenStep, exc: BaseException) -> None:
        reason = self.store.describe(exc)
        if not st.failed:
            logger.warning("smdebug: could not save step %d to %s: %s", st.step, self.store.uri, reason)
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
            event = codec.encode_tensor_event(name, array, step, wall_time, mode.value, mode_step)
            record = codec.frame(event, checksum=False)
            crc = codec.masked_crc32c(event)
        except Exception as exc:  # one unencodable tensor does not lose its step
            logger.warning(
                "smdebug: could not encode %s at step %d: %s", name, step, self.store.describe(exc)
            )
            return
        try:
            if st.staged is None:
                st.staged = self.store.stage(event_file_path(step, self.worker))
            offset = st.staged.size
            st.staged.write(record)
        except Exception as exc:
            self._fail(st, exc)
            return
        st.tensors.append(layout.tensor_entry(name, offset, len(record), crc))

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

    # -- publishing, with an ordered backlog while the store fails ---------------------------------------
    def _publish(self, pub: _Publication) -> None:
        if self._backlog:  # keep the order: a live reader must never see step n+1 before step n
            self._enqueue_backlog(pub)
            return
        try:
            pub.publish(self.store)
        except Exception as exc:
            self._last_error = self.store.describe(exc)
            if not self._transient(exc):
                self._given_up(pub, self._last_error)
                return
            logger.warning(
                "smdebug: could not write %s to %s: %s; retrying in the background while training goes on",
                pub.what,
                self.store.uri,
                self._last_error,
            )
            self._backoff = RETRY_FIRST
            self._retry_at = time.monotonic() + self._backoff
            self._enqueue_backlog(pub)
            return
        self._published(pub)

    def _transient(self, exc: BaseException) -> bool:
        """Whether a failed write is worth retrying: anything from a remote store (while a server comes
        back it may answer "no such bucket" or "access denied" too), nothing from a local disk."""
        return not self.store.is_local and not isinstance(exc, (ValueError, TypeError))

    def _given_up(self, pub: _Publication, reason: str) -> None:
        logger.warning("smdebug: could not save %s to %s: %s", pub.what, self.store.uri, reason)
        if pub.step is not None:
            self.failed_steps[pub.step] = reason
        else:
            self.failed_files[pub.parts[0][0]] = reason
        pub.discard()

    def _published(self, pub: _Publication) -> None:
        if pub.step is not None:
            self.written_steps.append(pub.step)

    def _enqueue_backlog(self, pub: _Publication) -> None:
        self._backlog.append(pub)
        # Waiting steps go to local disk beyond a small memory budget.
        if sum(p.in_memory() for p in self._backlog) > min(self.max_queue_bytes, 64 * 1024 * 1024):
            pub.spill()

    def _retry(self, max_backoff: float = RETRY_MAX) -> bool:
        """Publish the backlog in order until one fails; True when it is empty."""
        written = 0
        while self._backlog:
            pub = self._backlog[0]
            try:
                pub.publish(self.store)
            except Exception as exc:
                self._last_error = self.store.describe(exc)
                if not self._transient(exc):
                    self._given_up(self._backlog.popleft(), self._last_error)
                    continue
                self._backoff = min(self._backoff * 2, max_backoff)
                self._retry_at = time.monotonic() + self._backoff
                logger.debug("smdebug: retry of %s failed: %s", pub.what, self._last_error)
                return False
            self._backlog.popleft()
            self._published(pub)
            written += 1
        if written:
            logger.warning(
                "smdebug: %s is reachable again; wrote %d waiting item(s)", self.store.uri, written
            )
        self._backoff = RETRY_FIRST
        return True

    def _drain(self, deadline: float) -> None:
        """At close: keep retrying the backlog until the deadline, then record what is left as unsaved."""
        while self._backlog and not self._retry(max_backoff=2.0):
            wait = min(self._retry_at, deadline) - time.monotonic()
            if time.monotonic() >= deadline:
                break
            time.sleep(max(0.0, wait))
        for pub in self._backlog:
            if pub.step is not None:
                self.failed_steps[pub.step] = self._last_error
            else:
                self.failed_files[pub.parts[0][0]] = self._last_error
            pub.discard()
        self._backlog.clear()
