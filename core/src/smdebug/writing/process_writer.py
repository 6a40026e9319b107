"""The writer process, the training process's side: a local run's writer in a process of its own.

RunWriter's encoding and file publishing is Python. In the training process it holds the GIL, and the
training thread waits for it each time it comes back from a kernel or a system call: on a fast step that
wait costs more than the work itself. Here a child process (smdebug.writing.child) runs the RunWriter on
another core. The training thread copies each array it is given into memory shared with the child
(write_view: straight from a tensor's own memory, the only copy made). At the step's end its items go,
as one message, into a box of memory shared with the child; the boxed steps are announced down a pipe a
few at a time (smdebug.writing.wire: one write and one wake of the child for them, not one each), and
the child still takes a box that training died before announcing. The child answers flush, close and
status requests and forwards its log records on a second pipe, read by a thread that sleeps until it
speaks (starting, hearing and stopping the child: smdebug.writing.child_link).

A run starts on a RunWriter in this process, so its first steps are written at once and a short run never
starts a child; the child takes over once it is ready. Nothing is lost when it cannot start or dies: a
RunWriter in this process writes on, and the steps handed to the child whose index file is not in the
run are reported unsaved (the run records them, as any unsaved step). SMDEBUG_WRITER_PROCESS=0 keeps the
writer on threads.
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections.abc import Callable

import numpy as np

from smdebug.layout import index_file_path
from smdebug.modes import ModeKeys
from smdebug.store import Store, redact
from smdebug.writing.child_link import REPLY_GRACE, ChildLink
from smdebug.writing.outbox import unsaved_report
from smdebug.writing.settings import (
    BATCH_BYTES,
    NamesBytes,
    cache_bytes,
    close_timeout_from_env,
    max_queue_bytes_from_env,
    record_bytes,
)
from smdebug.writing.thread_writer import RunWriter, write_copy
from smdebug.writing.wire import (
    Compact,
    Gone,
    Names,
    encode,
    feed,
    message,
    owned,
    steps_of,
    write_all,
)

logger = logging.getLogger("smdebug")

SPAWN_AFTER_STEPS = 4  # a run that saved this many steps gets a writer process (a short one never does)
RECORD_SECONDS = 2.0  # what a takeover at close gets at least, for the record of the steps the child held
RING_BYTES = 8 * 1024 * 1024  # shared with the child for the arrays' bytes: a few steps of a small model
PIPED_BYTES = 4096  # a compact message's payload up to this size goes down the pipe (one copy either way)
# A finished step waits up to this long to go down the pipe with the next ones: one write (and one wake of
# the child) for a few fast steps instead of one each, and a reader sees a step this much later at most.
DEFER_SECONDS = 0.02


class ProcessWriter(ChildLink):
    """RunWriter's interface for the training thread, with the RunWriter itself in a child process.

    A run starts on a RunWriter in this process (a short run never starts a child). After a few steps a
    child is started; once it is ready, when a new step brings its first item, this process's RunWriter
    finishes what it has (published, the worker's claim kept) and the child writes from then on. When
    the child is gone, a RunWriter in this process takes over again, for good."""

    def __init__(
        self,
        store: Store | Callable[[], Store],
        worker: str,
        max_queue_bytes: int | None = None,
        close_timeout: float | None = None,
        *,
        uri: str,
        claim: tuple[str, str | None] | None = None,
        claim_token: str | None = None,
    ):
        super().__init__()  # no child yet (smdebug.writing.child_link)
        self.uri = redact(uri)
        self._uri = uri
        self.worker = worker
        self.max_queue_bytes = max_queue_bytes or max_queue_bytes_from_env()
        self._close_timeout = close_timeout  # None: SMDEBUG_CLOSE_TIMEOUT when it is needed
        # what the child reported (this process's writer, while there is one, keeps its own)
        self._failed_steps: dict[int, str] = {}
        self._failed_files: dict[str, str] = {}
        self._written: list[int] = []
        self._refused: str | None = None
        self._store = store
        self._claim_token = claim[0] if claim is not None else claim_token  # as RunWriter takes it
        # this process's writer: until the child takes over, and again if the child is gone
        self._local: RunWriter | None = RunWriter(
            store,
            worker,
            self.max_queue_bytes,
            self._close_timeout,
            uri=uri,
            claim=claim,
            claim_token=claim_token,
        )
        self._steps_written = 0  # steps with data this process's writer was given (the child starts late)
        self._last_step = -1  # the latest step this process's writer was given
        self._step_has_data = False
        self._batch: list = []  # RunWriter batch items of the step, sent to the child at its end
        self._batch_bytes = 0
        # finished steps waiting in a shared box to be announced to the child (DEFER_SECONDS): their items
        # (for a writer here, should the child be gone) and steps
        self._deferred: list[list] = []
        self._deferred_steps: set[int] = set()
        self._deferred_at = 0.0
        self._sending = threading.RLock()  # the training thread's sends and the flusher's
        self._flusher: threading.Thread | None = None  # sends deferred steps when training does not
        self._sent_steps = array("q")  # steps the child was given items of, in order (8 bytes each)
        self._names = Names(cache_bytes(self.max_queue_bytes))
        self._compact = Compact(self._names)
        self._names_bytes = NamesBytes()
        self._closed = False

    def _local_takes(self, step: int) -> bool:
        """Whether an item of ``step`` goes to this process's writer (asked while there is one). The first
        item of a new step hands over to a ready child: no step is written by both (a step written again is
        replaced whole)."""
        if step > self._last_step:
            if self._ready and self._gone is None and not self._forked():
                self._hand_over()
                return self._local is not None
            self._last_step = step
        return True

    def _hand_over(self) -> None:
        """This process's writer publishes what it has, and the child writes from now on (told what could
        not be saved so far, for the run's record of it)."""
        local, self._local = self._local, None
        local.close(self.close_timeout, end_of_job=False)  # keeps the worker's claim for the child
        self._failed_steps, self._failed_files = dict(local.failed_steps), dict(local.failed_files)
        self._written = list(local.written_steps)
        if local.refused:  # the run is not this writer's: nothing is written, by anyone
            self._gone = "the run is not this writer's"
            self._stop_child()
            self._local = RunWriter(self._store, self.worker, self.max_queue_bytes, uri=self._uri)
            self._local.refused = local.refused
        else:
            if self._failed_steps or self._failed_files:
                self._send(request=["failed", self._failed_steps, self._failed_files])
            if self._written:  # (a late save into one of them, a health recorder's row, is added to it)
                self._send(request=["before", self._written])

    def _request(self, kind: str, *args, wait: float) -> dict | None:
        """Send a request after everything queued; the child's answer, or None when it gave none."""
        self._next_id += 1
        ident = self._next_id
        self._send(request=[kind, ident, *args])
        if self._local is not None:
            return None
        reply = self._reply(ident, wait)
        if reply is not None:
            self._apply(reply["state"])
        return reply

    def _apply(self, state: dict) -> None:
        self._failed_steps.update({int(k): v for k, v in state["failed_steps"].items()})
        self._failed_files.update(state["failed_files"])
        self._written.extend(state["written_steps"])
        self._refused = state["refused"]

    # what was written and what could not be, whoever writes (RunWriter's attributes)
    @property
    def failed_steps(self) -> dict[int, str]:
        return self._local.failed_steps if self._local is not None else self._failed_steps

    @property
    def failed_files(self) -> dict[str, str]:
        return self._local.failed_files if self._local is not None else self._failed_files

    @property
    def written_steps(self) -> list[int]:
        return self._local.written_steps if self._local is not None else self._written

    @property
    def refused(self) -> str | None:
        return self._local.refused if self._local is not None else self._refused

    # -- training thread ----------------------------------------------------------------------------
    def write_tensor(
        self,
        step: int,
        mode: ModeKeys,
        mode_step: int,
        name: str,
        array: np.ndarray,
        wall_time=None,
        reserved=0,
    ) -> None:
        self._step_has_data = True
        if self._local is not None and self._local_takes(step):
            self._local.write_tensor(step, mode, mode_step, name, array, wall_time, reserved)
            return
        wall_time = time.time() if wall_time is None else wall_time
        self._batch.append(("tensor", step, mode, mode_step, name, array, wall_time))
        self._held(array.nbytes + record_bytes(name))

    def write_view(self, step: int, mode: ModeKeys, mode_step: int, name: str, view: np.ndarray) -> None:
        """write_tensor of a view of memory that training changes once this returns: copied into the
        ring (the child's copy, in the one copy the training thread makes), or else into an array."""
        wall_time = time.time()
        if (
            self._local is None
            and self._ring is not None
            and view.dtype.kind in "biufc"
            and not self._forked()
        ):
            in_ring = self._ring.copy_in(view)
            if in_ring is not None:
                self.write_tensor(step, mode, mode_step, name, in_ring, wall_time)
                return
        write_copy(self, step, mode, mode_step, name, view, wall_time)

    def write_scalars(self, step, mode, mode_step, names, values, wall_time) -> None:
        self._step_has_data = True
        if self._local is not None and self._local_takes(step):
            self._local.write_scalars(step, mode, mode_step, names, values, wall_time)
        else:
            self._batch.append(("scalars", step, mode, mode_step, names, values, wall_time))
            self._held(self._names_bytes(names))

    def write_shape(self, step, mode, mode_step, name, shape) -> None:
        self._step_has_data = True
        if self._local is not None and self._local_takes(step):
            self._local.write_shape(step, mode, mode_step, name, shape)
        else:
            self._batch.append(("shape", step, mode, mode_step, name, list(shape)))
            self._held(record_bytes(name))

    def _held(self, nbytes: int) -> None:
        """Count what the step's batch holds (names and records too, not only arrays): past the batch
        size, or the queue bound when smaller, it goes to the child, whose own queue is bounded."""
        self._batch_bytes += nbytes
        if self._batch_bytes >= min(BATCH_BYTES, self.max_queue_bytes):
            self._send()

    def reserve(self, nbytes: int) -> None:
        """Before a large tensor is copied: what waits here goes first (the child's queue is bounded)."""
        if self._local is not None:
            self._local.reserve(nbytes)
        elif nbytes > 0:
            self._send()

    def end_step(self, step: int) -> None:
        wrote, self._step_has_data = self._step_has_data, False
        if self._local is None:
            if wrote:
                self._batch.append(("end", step))
            self._send(defer=True)
            return
        self._local.end_step(step)
        if wrote and self._proc is None and self._gone is None and not self._forked():
            self._steps_written += 1
            if self._steps_written >= SPAWN_AFTER_STEPS:
                self._start(min(RING_BYTES, self.max_queue_bytes))  # within the bound too

    def write_file(self, relpath: str, data: bytes) -> None:
        if self._local is not None:
            self._local.write_file(relpath, data)
        else:
            self._batch.append(("file", relpath, data))
            self._send()

    @property
    def close_timeout(self) -> float:
        """Seconds close() (and flush) wait at most: as given, else SMDEBUG_CLOSE_TIMEOUT as it is set
        when they are called (a script may set it just before closing)."""
        return close_timeout_from_env() if self._close_timeout is None else self._close_timeout

    def flush(self, timeout: float | None = None) -> bool:
        if self._closed or self._forked():
            return True
        timeout = self.close_timeout if timeout is None else timeout
        if self._local is None:
            reply = self._request("flush", timeout, wait=timeout + REPLY_GRACE)
            if reply is not None:
                return reply["result"]
            if self._gone is None:
                return False  # no answer in time: the child is still working
            self._take_over()
        return self._local.flush(timeout)

    def close(self, timeout: float | None = None, end_of_job: int = 0) -> dict[int, str]:
        if self._closed or self._forked():
            return self.failed_steps
        self._closed = True
        timeout = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if self._local is None:
            reply = self._request("close", timeout, end_of_job, wait=timeout + REPLY_GRACE)
            if reply is not None:
                self._stop_child()
                self._ring = self._mail = None  # unmapped here (a process making many hooks keeps none)
                return self.failed_steps
            self._mark_gone(
                f"it did not finish within the close timeout ({timeout:g} s); the hook stopped it"
            )
            self._take_over()  # gone or hung: this process finishes the run
        self._stop_child()  # started, not yet handed over: it has nothing
        self._ring = self._mail = None
        # past the deadline when the child hung: still the time to record the steps it held
        self._local.close(max(RECORD_SECONDS, deadline - time.monotonic()), end_of_job)
        return self.failed_steps

    def unsaved_report(self) -> str:
        return unsaved_report(self.failed_steps, self.failed_files)

    @property
    def pending_steps(self) -> list[int]:
        """Finished steps waiting for the store to come back."""
        state = self._status()
        return self._local.pending_steps if self._local is not None else state["pending_steps"]

    @property
    def failing(self) -> bool:
        """Whether the store is failing (steps wait for a retry)."""
        state = self._status()
        return self._local.failing if self._local is not None else state["failing"]

    def _status(self) -> dict:
        reply = None if self._local is not None else self._request("status", wait=REPLY_GRACE)
        return reply["state"] if reply is not None else {"pending_steps": [], "failing": False}

    # -- sending ------------------------------------------------------------------------------------
    def _send(self, request: list | None = None, defer: bool = False) -> None:
        """Send what waits (the deferred steps, the step's batch, then the request) to the child. A finished
        step (``defer``) may wait for the next ones in a shared box, DEFER_SECONDS at most (the flusher
        announces it then if training does not)."""
        if self._forked():
            self._batch, self._batch_bytes = [], 0
            return
        with self._sending:
            items, self._batch, self._batch_bytes = self._batch, [], 0
            if self._local is not None:
                feed(self._local, items)
                return
            if self._gone is not None:
                self._take_over(unsent=items)
                return
            parts, steps = [], set()
            if items:  # (a deferred step's payload goes in the box, not the ring: it is read later)
                deferring = defer and self._mail is not None
                steps = self._message(items, self._ring.used if deferring else None, parts)
                if deferring and self._mail.put(parts, sum(memoryview(part).nbytes for part in parts)):
                    now = time.monotonic()
                    if not self._deferred:
                        self._deferred_at = now
                        if self._flusher is None:
                            self._flusher = threading.Thread(target=self._flush_later, daemon=True)
                            self._flusher.start()
                    self._deferred.append(items)
                    self._deferred_steps |= steps
                    if now - self._deferred_at < DEFER_SECONDS:
                        return
                    parts, steps, items = [], set(), []
            if not self._send_now(parts, steps, request):
                self._take_over(unsent=items)

    def _flush_later(self) -> None:
        """The flusher thread: deferred steps go to the child within about DEFER_SECONDS also when training
        makes no next step (a pause, an evaluation without the hook, a script that closes much later)."""
        while True:
            time.sleep(DEFER_SECONDS)
            with self._sending:
                if self._closed or self._gone is not None or self._local is not None or self._forked():
                    return  # what waits goes with close's request, or to the writer that takes over
                if self._deferred and time.monotonic() - self._deferred_at >= DEFER_SECONDS:
                    self._send_now([], set(), None)  # (the child gone: training's next send takes over)

    def _send_now(self, parts: list, steps: set[int], request: list | None) -> bool:
        """Write the announcement of the deferred steps, then ``parts`` (a message of ``steps``) and the
        request, in one go; False when the child is gone (the deferred steps stay for the takeover)."""
        announce = self._mail.announce() if self._mail is not None else None
        if announce is not None:
            parts = [*message(announce), *parts]
        if request is not None:
            parts += message(request)
        if not parts:
            return True
        try:
            write_all(self._fd, parts, sum(memoryview(part).nbytes for part in parts))
        except Gone as exc:
            self._mark_gone(str(exc))
            return False  # a message cut short is never read by the child
        if self._deferred:
            steps |= self._deferred_steps
            self._deferred, self._deferred_steps = [], set()
        sent = self._sent_steps
        for step in sorted(steps) if len(steps) > 1 else steps:
            if not sent or step != sent[-1]:
                sent.append(step)
        return True

    def _message(self, items: list, used: int | None, parts: list) -> set[int]:
        """Add the message of these items to ``parts``; their steps. ``used`` for deferred items: how much of
        the ring was given out when they were deferred. Their payload then goes down the pipe, and the child
        is told the ring was read up to there only: later steps' arrays may be in the ring already."""
        ring = self._ring
        fast = self._compact(items) if ring is not None else None  # a common step: a binary header
        if fast is not None:  # a small payload goes down the pipe with it: no room taken in the ring
            head, buffers, nbytes, steps = fast
            shared = ring.put(buffers, nbytes) if used is None and nbytes > PIPED_BYTES else None
            parts += Compact.message(head, buffers, nbytes, shared, ring.used if used is None else used)
            return steps
        header, buffers = encode(items, self._names)
        if ring is None:
            parts += message(["items", header], buffers)
        else:
            # the child gives back the ring up to all that was put in it so far, once it has read
            nbytes = sum(memoryview(b).nbytes for b in buffers) if used is None else 0
            shared = ring.put(buffers, nbytes) if nbytes else None
            head = ["items", header, shared, ring.used if used is None else used]
            parts += message(head) if shared else message(head, buffers)
        return steps_of(items)

    # -- when the child is gone ---------------------------------------------------------------------
    def _take_over(self, unsent: list = ()) -> None:
        """Write in this process from now on: the items not yet given to the child go to a RunWriter
        here; steps the child had and did not write are reported unsaved."""
        with self._sending:  # (not while the flusher sends)
            if self._local is not None:
                return
            if self._mail is not None:
                self._mail.drop()  # its steps are written here (self._deferred)
            self._stop_child(kill=True)
            try:
                store = self._store() if callable(self._store) else self._store
            except Exception:  # the RunWriter reports why it cannot open it
                store = None
            lost = {}
            for step in sorted(set(self._sent_steps)):
                try:
                    written = store is not None and store.exists(index_file_path(step, self.worker))
                except Exception:
                    written = False
                if not written:
                    lost[step] = f"the writer process stopped before writing it ({self._gone})"
            if self._sent_steps or unsent or self._deferred or self._batch:  # (else it had nothing yet)
                logger.warning(
                    "smdebug: the writer process of %s stopped (%s); writing in the training process from now on%s",
                    self.uri,
                    self._gone,
                    f"; {len(lost)} step(s) it had not written are lost" if lost else "",
                )
            self._local = RunWriter(
                store if store is not None else self._store,
                self.worker,
                self.max_queue_bytes,
                self._close_timeout,
                uri=self._uri,
                claim_token=self._claim_token,  # the name is claimed already, by this process's first writer
            )
            self._local.failed_steps.update({**self._failed_steps, **lost})
            self._local.failed_files.update(self._failed_files)
            self._local.written_steps.extend(self._written)
            self._local.written_before(self._written)
            deferred = [item for some in self._deferred for item in some]
            items = [owned(item, self._ring) for item in [*deferred, *unsent, *self._batch]]
            self._batch, self._deferred = [], []
            feed(self._local, [item for item in items if item[0] == "file" or item[1] not in lost])
