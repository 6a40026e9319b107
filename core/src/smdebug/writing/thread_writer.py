"""The thread writer: a worker's steps written in smdebug's layout from background threads.

The training thread only queues host numpy arrays and never waits on storage. The encoder thread turns
queued arrays into a step's files (staged locally: a temp file beside the destination, or a spooled
buffer for a remote store) and hands finished steps to the outbox (smdebug.writing.outbox), whose
publisher thread sends them to the store in order. The queue is bounded in bytes; it drains into local
staging whatever the store does, so the training thread only waits when it produces faster than encoding
(nothing is dropped). ``close()`` returns within its timeout whatever the store does.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from smdebug import codec, layout
from smdebug.layout import event_file_path, index_file_path
from smdebug.modes import ModeKeys, to_mode
from smdebug.store import StagedFile, Store, redact
from smdebug.writing.outbox import UPLOAD_COPIES, Outbox, Publication
from smdebug.writing.settings import (
    BATCH_BYTES,
    RESERVE_BYTES,
    SCALAR_BYTES,
    NamesBytes,
    cache_bytes,
    close_timeout_from_env,
    max_queue_bytes_from_env,
    record_bytes,
)

logger = logging.getLogger("smdebug")
_BACKLOG = "still queued for the writer at the close timeout (not encoded)"
# steps whose index a writer remembers publishing, so that one written again is reopened from it (a health
# recorder's rows reach 100 steps back by default)
PUBLISHED_KEPT = 1024


@dataclass
class _OpenStep:
    step: int
    mode: ModeKeys
    mode_step: int
    staged: StagedFile | None = None
    tensors: list = field(default_factory=list)
    shapes: list = field(default_factory=list)
    failed: bool = False
    counted: int = 0  # what it still counts in the writer's bound (a remote store's step: until sent)


class RunWriter(Outbox):
    """Writes the steps of one worker to a Store from background threads (a ``Writer``).

    ``store`` is a Store, or a callable that opens one (called on the writer's thread: opening a remote
    store may wait on the network). ``claim=(token, released_worker or None)`` makes the writer claim its
    worker name before writing anything."""

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
        # a store is any object with the members of smdebug.types.Store (a plugin's need not subclass the
        # core's); an opener is a function
        self.store: Store | None = None if callable(store) and not isinstance(store, Store) else store
        self._opener = None if self.store is not None else store
        self.uri = self.store.uri if self.store is not None else redact(uri or "?")
        self.worker = worker
        self.max_queue_bytes = max_queue_bytes or max_queue_bytes_from_env()
        # the bound covers the encoder's cache of headers per name and (in a writer process) the table of
        # reduction names it was sent: the queue holds the rest
        self._templates = codec.Templates(cache_bytes(self.max_queue_bytes))
        self._limit = self.max_queue_bytes - 2 * cache_bytes(self.max_queue_bytes)
        # A remote store's step holds its bytes until it is sent: staged in memory (or not, on disk),
        # then the upload's two copies. So each record counts twice, from its queueing until its step is
        # sent; a local step's files are on disk once encoded.
        local = self.store.is_local if self.store is not None else Store.is_plain_local(self.uri)
        self._copies = 1 if local else UPLOAD_COPIES
        self._close_timeout = close_timeout  # None: SMDEBUG_CLOSE_TIMEOUT when it is needed
        self.failed_steps: dict[int, str] = {}  # steps that will never be saved -> why
        self.failed_files: dict[str, str] = {}
        self.written_steps: list[int] = []
        self.refused: str | None = None  # why this writer writes nothing at all
        self._queue: queue.Queue = queue.Queue()
        # A step's items go to the encoder thread together at its end (each put wakes that thread, which
        # then competes with training for the GIL): the batch and what it holds in bytes.
        self._batch: list = []
        self._batch_bytes = 0
        # What the writer holds for the user within its bound, guarded by _lock: queued records, steps
        # being encoded or waiting to be sent, uploads in flight. Training waits while it is at the bound.
        self._held = 0
        self._lock = threading.Condition()
        self._names_bytes = NamesBytes()
        self._step_has_data = False  # anything queued for the step that end_step will finish
        # steps the training thread gave data to that are not written yet (not every step of the run: a
        # long run would hold them all)
        self._unwritten: set[int] = set()
        self._open: _OpenStep | None = None
        self._ended: _OpenStep | None = None  # the last step written (its records, not its bytes)
        self._highest = -1  # the highest step finished: one at or below it may be written again
        self._published: collections.deque = collections.deque(maxlen=PUBLISHED_KEPT)  # (steps, lately)
        self._closed = False
        self._start_outbox(claim, claim_token)
        self._thread = threading.Thread(target=self._run, name=f"smdebug-writer-{worker}", daemon=True)
        self._thread.start()

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
        nbytes = int(array.nbytes) + record_bytes(name)  # every byte held for it, not just the array's
        if reserved:
            with self._lock:
                self._held += (nbytes - reserved) * self._copies
        else:
            self.reserve(nbytes)
        self._step_has_data = True
        self._unwritten.add(step)
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
        nbytes = SCALAR_BYTES * len(values) + self._names_bytes(names)
        self.reserve(nbytes)
        self._step_has_data = True
        self._unwritten.add(step)
        self._batch.append(("scalars", step, mode, mode_step, names, values, wall_time, nbytes))
        self._batch_bytes += nbytes

    def reserve(self, nbytes: int) -> None:
        """Wait until the queue has room for ``nbytes`` more and count them in it (write_tensor does;
        a caller that copies a tensor for the writer waits before copying, so that the copy is within the
        bound, then passes ``reserved=nbytes``). One item is always admitted into an empty queue however
        large it is (the objects of steps waiting for a failing store aside)."""
        nbytes *= self._copies
        with self._lock:
            while self._held > self._parked() and self._held + nbytes > self._limit:
                if self._batch:
                    self._send_batch()  # the encoder frees room only for what it has been given
                self._wait_for_room(self._until_hung())  # (a hung upload frees none: looked at again)
            self._held += nbytes

    def _send_batch(self) -> None:
        if self._batch:
            batch, self._batch, self._batch_bytes = self._batch, [], 0
            self._queue.put(("batch", batch))

    def write_shape(self, step: int, mode: ModeKeys, mode_step: int, name: str, shape) -> None:
        self._step_has_data = True
        self._unwritten.add(step)
        nbytes = record_bytes(name)
        self.reserve(nbytes)
        self._batch.append(("shape", step, mode, mode_step, name, list(shape), nbytes))

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

    def written_before(self, steps) -> None:
        """Steps another writer of this worker's run wrote (the one this writer takes over from): more
        tensors for one of them are added to its files, not written over them."""
        self._send_batch()
        self._queue.put(("before", list(steps)[-PUBLISHED_KEPT:]))

    def write_view(self, step: int, mode: ModeKeys, mode_step: int, name: str, view: np.ndarray) -> None:
        """write_tensor of a view of memory that training changes once this returns: copied at once (a
        large one once the queue has room for it)."""
        write_copy(self, step, mode, mode_step, name, view, time.time())

    @property
    def held_bytes(self) -> int:
        """What the writer holds for the user now (queued records, staged steps, uploads in flight)."""
        return self._held

    @property
    def close_timeout(self) -> float:
        """Seconds close() (and flush) wait at most: as given, else SMDEBUG_CLOSE_TIMEOUT as it is set
        when they are called (a script may set it just before closing)."""
        return close_timeout_from_env() if self._close_timeout is None else self._close_timeout

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
        return self._wait_published(deadline)

    def close(
        self, timeout: float | None = None, end_of_job: int = 0, finish_open_step: bool = True
    ) -> dict[int, str]:
        """Write everything queued, retrying a failing store, and stop; returns within ``timeout``
        seconds (default ``close_timeout``) whatever the store does, with the steps that were not saved.
        With ``end_of_job`` (the job's number of workers: of several, the last to end writes it)
        the run's end-of-job marker is written last, after the record of any steps
        that could not be saved (and not at all when that record cannot be written). Without
        ``finish_open_step`` a step whose end was not queued is dropped (its process died mid-step)."""
        if self._closed:
            return self.failed_steps
        self._closed = True
        timeout = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self._start_drain(deadline, timeout, end_of_job)
        self._send_batch()
        self._queue.put(("stop", finish_open_step))
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._publisher.join(max(0.0, self._drain_deadline - time.monotonic()))
        # the publisher still in a request at the drain's end: the record of unsaved steps and the marker
        # are written beside it, with what is left of the timeout
        finisher = (self._publisher.is_alive() and self._finish_beside()) or self._publisher
        finisher.join(max(0.0, deadline - time.monotonic()))
        finisher = self._finisher or finisher  # (the publisher, its request done, may have taken them)
        finisher.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive() or finisher.is_alive():
            self._abandon(timeout)  # a request that hangs: stop waiting for it
        return self.failed_steps

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
        while True:
            msg = self._queue.get()
            for item in msg[1] if msg[0] == "batch" else (msg,):
                if self._handle(item):
                    return

    def _handle(self, item: tuple) -> bool:
        """Encode or publish one queued item on the encoder thread; True after the last one (stop)."""
        kind = item[0]
        try:
            if self._abandoned and kind in ("tensor", "scalars", "shape", "end", "file"):
                pass  # close() gave up on a store that hangs: nothing more is written
            elif self._drain_deadline is not None and self._past_drain(item):
                pass  # close()'s deadline came before this backlog: recorded unsaved, not encoded
            elif kind == "tensor":
                self._tensor(*item[1:7])
            elif kind == "scalars":
                self._scalars(*item[1:7])
            elif kind == "shape":
                self._shape(*item[1:6])
            elif kind == "end":
                self._finish(item[1])
            elif kind == "file":
                self._publish(Publication(None, [(item[1], item[2])]))
            elif kind == "before" and item[1]:
                self._published.extend(item[1])
                self._highest = max(self._highest, *item[1])
            elif kind == "flush":
                item[1].set()
            elif kind == "stop":
                if self._draining_over():
                    if self._open is not None:
                        self._backlog_unsaved(self._open.step)
                elif self._open is not None and item[1]:
                    self._finish(self._open.step)
                elif self._open is not None:
                    self._discard_staged(self._open)
        except Exception as exc:  # the writer thread must survive anything
            logger.warning("smdebug: writer error: %s", self._describe(exc))
        finally:
            if kind in ("tensor", "scalars", "shape"):
                nbytes, st = item[7 if kind != "shape" else 6] * self._copies, self._open
                if self._copies > 1 and st is not None and st.step == item[1] and not st.failed:
                    st.counted += nbytes  # held by its step until sent (staged, then uploaded)
                else:
                    self._count(-nbytes)
            if kind == "stop":
                with self._lock:
                    self._encoded_all = True
                    self._lock.notify_all()
        return kind == "stop"

    def _past_drain(self, item: tuple) -> bool:
        """Whether close()'s drain deadline has passed: then a step still queued (tensor, scalars, shape
        or end) is recorded unsaved instead of encoded, so that the publisher still has the time to
        write the record of unsaved steps before close() returns."""
        if item[0] not in ("tensor", "scalars", "shape", "end") or time.monotonic() < self._drain_deadline:
            return False
        self._backlog_unsaved(item[1])
        return True

    def _backlog_unsaved(self, step: int) -> None:
        st = self._open
        if st is not None:  # the step being encoded goes too: its files would be incomplete
            self._open = None
            self._discard_staged(st)
            self.failed_steps.setdefault(st.step, _BACKLOG)
        if step not in self.failed_steps:
            self.failed_steps[step] = _BACKLOG

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
            elif (
                step <= self._highest
                and step in self._published
                and (earlier := self._earlier(step)) is not None
            ):
                self._open = self._reopen(earlier)
            else:
                self._open = _OpenStep(step, mode, mode_step)
                if self.refused:
                    self._open.failed = True
                    self.failed_steps[step] = self.refused
        return self._open

    def _earlier(self, step: int) -> _OpenStep | None:
        """The records of a step finished before the last one, written again (a health recorder's rows
        after a step's own saves, a value saved into an ended step after later steps were written), from
        its index: in the outbox or in the store (a step this writer published lately: no store is asked
        about others). None when there is none."""
        if step in self.failed_steps:  # recorded unsaved: it stays so
            return None
        with self._lock:
            waiting = next((p for p in self._outbox if p.step == step), None)
            index = next((p[1] for p in waiting.parts if isinstance(p, tuple)), None) if waiting else None
        try:
            if index is None:
                index = self.store.read_bytes(index_file_path(step, self.worker))
            record = layout.decode_index(index)
            mode = to_mode(record.mode)
        except Exception:  # none (or not readable): the step is written as a new one
            return None
        tensors = [layout.tensor_entry(*t) for t in record.tensors]
        shapes = [layout.shape_entry(name, shape) for name, shape in record.shapes]
        return _OpenStep(
            step, mode, record.mode_step if record.mode_step is not None else step, None, tensors, shapes
        )

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
                self._wait_for_sending(1.0)
            if waiting is not None and waiting.parts and not isinstance(waiting.parts[0], tuple):
                self._outbox.remove(waiting)  # not yet published: append to the staged file itself
                self._outbox_memory -= waiting.memory
                st.counted = waiting.memory  # what it counts goes with it
                st.staged = waiting.parts[0]
                st.staged.resume()
                return st
        try:
            st.staged = self.store.stage(event_file_path(st.step, self.worker))
            st.staged.write(self.store.read_bytes(event_file_path(st.step, self.worker)))
            if self._copies > 1:
                st.counted = self._copies * st.staged.size
                self._count(st.counted)
        except Exception as exc:
            self._fail(st, exc)
        return st

    def _fail(self, st: _OpenStep, exc: BaseException) -> None:
        reason = self._describe(exc)
        if not st.failed:
            self._warn_unsaved(f"step {st.step}", reason, st.step)
        st.failed = True
        self.failed_steps[st.step] = reason
        self._discard_staged(st)

    def _discard_staged(self, st: _OpenStep) -> None:
        if st.staged is not None:
            st.staged.discard()
            st.staged = None
        self._count(-st.counted)
        st.counted = 0

    def _tensor(self, step, mode, mode_step, name, array, wall_time) -> None:
        st = self._step(step, mode, mode_step)
        if st.failed:
            return
        try:
            # smdebug 1.0's reader insists on its "no checksum" footer in tensor event files, so the
            # payload's CRC goes in the index entry instead (smdebug 1.0 ignores keys it does not know).
            # The record stays in chunks, a large tensor's content a view of the array: no copy of it.
            event = codec.tensor_event_chunks(
                name, array, step, wall_time, mode.value, mode_step, self._templates
            )
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
            data, records = codec.step_scalar_records(
                names, values, step, wall_time, mode.value, mode_step, self._templates
            )
        except Exception as exc:  # one by one: only what cannot be encoded is lost
            logger.debug("smdebug: encoding reductions together failed (%s); one by one", exc)
            for some, array in zip(names, values):
                for name, value in zip(some, array):
                    self._tensor(step, mode, mode_step, name, np.asarray(value), wall_time)
            return
        offset = self._append(st, [data])
        if offset is not None:
            st.tensors.extend(layout.tensor_entries_json(records, offset))

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
        self._highest = max(self._highest, step)
        if st.failed or not (st.tensors or st.shapes):
            self._discard_staged(st)
            return
        index = layout.encode_index(
            st.mode.name, st.mode_step, event_file_path(step, self.worker), st.tensors, st.shapes
        )
        parts = []
        if st.staged is not None:
            seal = getattr(st.staged, "seal", None)  # the core's own (a plugin's commit does it all)
            try:  # the file's last buffered bytes are written now: a full disk may fail only here
                if seal is not None:
                    seal()
            except Exception as exc:
                self._fail(st, exc)
                return
            parts.append(st.staged)
        st.staged = None  # the publication owns it now, and what it counts in the bound
        counted, st.counted = st.counted, 0
        parts.append((index_file_path(step, self.worker), index))
        self._published.append(step)
        self._publish(Publication(step, parts), counted)


def write_copy(
    writer, step: int, mode: ModeKeys, mode_step: int, name: str, view: np.ndarray, wall_time
) -> None:
    """Give ``writer`` a copy of ``view``, made once its queue has room for it when it is large."""
    reserved = view.nbytes if view.nbytes >= RESERVE_BYTES else 0
    if reserved:
        writer.reserve(reserved)
    writer.write_tensor(step, mode, mode_step, name, view.copy(), wall_time, reserved)
