"""The run's writer in a process of its own, for a local out_dir.

RunWriter's encoding and file publishing is Python. In the training process it holds the GIL, and the
training thread waits for it each time it comes back from a kernel or a system call: on a fast step that
wait costs more than the work itself. Here a child process (``smdebug.writer_process.main``)
runs the RunWriter on another core. The training thread copies each array it is given into memory shared
with the child (write_view: straight from a tensor's own memory, the only copy made), and sends the
step's items down a pipe at the step's end, as a JSON header; the child copies the arrays out when it
reads it. Arrays that do not fit, or all of them where there is no memfd_create (Linux's), follow the
header in the same vectored write. The child answers flush, close and status requests and forwards its
log records on a second pipe, read by a thread that sleeps until it speaks.

A run starts on a RunWriter in this process, so its first steps are written at once and a short run never
starts a child; the child takes over once it is ready. Nothing is lost when it cannot start or dies: a
RunWriter in this process writes on, and the steps handed to the child whose index file is not in the
run are reported unsaved (the run records them, as any unsaved step). A training process that dies leaves
the child an end of file: it publishes the finished steps it has, drops the unfinished one and writes no
end-of-job marker. SMDEBUG_WRITER_PROCESS=0 keeps the writer on threads.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

try:
    import fcntl
except ImportError:  # not a POSIX system: the writer stays on threads
    fcntl = None

from smdebug.layout import index_file_path
from smdebug.modes import ModeKeys
from smdebug.store import Store, redact
from smdebug.writer import (
    BATCH_BYTES,
    RESERVE_BYTES,
    RunWriter,
    close_timeout_from_env,
    max_queue_bytes_from_env,
    unsaved_report,
)

logger = logging.getLogger("smdebug")

ENV = "SMDEBUG_WRITER_PROCESS"
SPAWN_AFTER_STEPS = 4  # a run that saved this many steps gets a writer process (a short one never does)
REPLY_GRACE = 5.0  # seconds beyond a request's own timeout that the child may take to answer
_FRAME = struct.Struct("<II")  # header length, payload length
_IOV_MAX = 512  # buffers per writev call (Linux allows 1024)
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux's number, where fcntl does not name it
_PIPE_BYTES = 1024 * 1024  # a step's items fit in the pipe: the training thread rarely waits on the child
RING_BYTES = 8 * 1024 * 1024  # shared with the child for the arrays' bytes: a few steps of a small model
_RING_READ = struct.Struct("<Q")  # at the ring's start: how many bytes the child has read (it writes it)
_RING_START = 64  # where the arrays' bytes begin


# this process's id, kept up to date in forked children without a system call per saved tensor
_pid = [os.getpid()]
if hasattr(os, "register_at_fork"):  # (where it is missing, there is no fork either)
    os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


class _Gone(Exception):
    """The child process cannot take more: it exited."""


class _Ring:
    """Memory shared with the child, used in a circle: arrays go in one after another, and the child
    copies them out when it reads the message that describes them from the pipe, then notes at the start
    of the ring how far it has read. Nothing waits for room: an array that does not fit goes down the pipe."""

    def __init__(self, size: int):
        self.fd = os.memfd_create("smdebug-writer")  # no name in any file system; gone with its last user
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        self.bytes = np.frombuffer(self.map, np.uint8)  # for arrays with strides
        self.size = size - _RING_START
        self.used = 0  # bytes handed out so far (where the next array goes, modulo the size)

    def take(self, nbytes: int) -> int | None:
        """Where ``nbytes`` go (in one piece, 64-byte aligned), or None when the child has not read enough
        of the ring yet."""
        used, size = self.used, self.size
        at = used % size
        if at + nbytes > size:  # never split: start again at the beginning
            used += size - at
            at = 0
        end = used + -(-nbytes // 64) * 64
        if end - _RING_READ.unpack_from(self.map)[0] > size:
            return None
        self.used = end
        return _RING_START + at

    def put(self, buffers: list, nbytes: int) -> list | None:
        """Copy the buffers in, one after another: [offset, bytes] for the child, or None."""
        position = self.take(nbytes)
        if position is None:
            return None
        start = position
        for view in map(memoryview, buffers):
            if view.nbytes:  # (an empty array's view cannot be cast)
                self.map[position : position + view.nbytes] = view.cast("B")
                position += view.nbytes
        return [start, nbytes]

    def copy_in(self, array: np.ndarray) -> _InRing | None:
        """Copy one array in, or None when there is no room for it."""
        nbytes = array.nbytes
        position = self.take(nbytes)
        if position is None:
            return None
        if nbytes and array.flags.c_contiguous:
            self.map[position : position + nbytes] = memoryview(array).cast("B")
        elif nbytes:  # strided
            place = self.bytes[position : position + nbytes].view(array.dtype).reshape(array.shape)
            np.copyto(place, array)
        return _InRing(position, array.dtype, array.shape, nbytes)


class _InRing:
    """An array copied into the ring, in a step's batch: where it is, its dtype and shape."""

    __slots__ = ("position", "dtype", "shape", "nbytes")

    def __init__(self, position: int, dtype: np.dtype, shape: tuple, nbytes: int):
        self.position, self.dtype, self.shape, self.nbytes = position, dtype, shape, nbytes

    def copy(self, ring: _Ring) -> np.ndarray:
        data = ring.bytes[self.position : self.position + self.nbytes]
        return data.view(self.dtype).reshape(self.shape).copy()


class ProcessWriter:
    """RunWriter's interface for the training thread, with the RunWriter itself in a child process.

    A run starts on a RunWriter in this process (a short run never starts a child). After a few steps a
    child is started; once it is ready, when a new step brings its first item, this process's RunWriter
    finishes what it has (published, the worker's claim kept) and the child writes from then on. When
    the child is gone, a RunWriter in this process takes over again, for good."""

    @staticmethod
    def wanted(uri: str, store: Store | None) -> bool:
        """Whether the run at ``uri`` gets a writer process: a local folder in the core's own Store (the
        child writes through one, without loading plugins), unless SMDEBUG_WRITER_PROCESS=0."""
        if os.environ.get(ENV, "").strip().lower() in ("0", "false", "no", "off") or not sys.executable:
            return False
        if fcntl is None or not hasattr(os, "writev"):
            return False
        if store is not None:
            return type(store) is Store and store.is_local
        return Store.is_plain_local(uri)

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
        self.uri = redact(uri)
        self._uri = uri
        self.worker = worker
        self.max_queue_bytes = max_queue_bytes or max_queue_bytes_from_env()
        self.close_timeout = close_timeout_from_env() if close_timeout is None else close_timeout
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
            self.close_timeout,
            uri=uri,
            claim=claim,
            claim_token=claim_token,
        )
        self._steps_written = 0  # steps with data this process's writer was given (the child starts late)
        self._last_step = -1  # the latest step this process's writer was given
        self._step_has_data = False
        self._batch: list = []  # RunWriter batch items of the step, sent to the child at its end
        self._batch_bytes = 0
        self._sent_steps: set[int] = set()  # steps the child was given items of
        self._names = _Names()
        self._closed = False
        self._pid = _pid[0]
        self._proc: subprocess.Popen | None = None
        self._ring: _Ring | None = None
        self._ready = False  # the child said it is ready (set by the reply thread)
        self._gone: str | None = None  # why there is no child (then none is started again)
        self._replies: dict[int, dict] = {}
        self._cond = threading.Condition()
        self._next_id = 0

    # -- the child ----------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start the child (it takes over once it says it is ready); this process writes on if it cannot."""
        try:
            self._spawn()
        except Exception as exc:
            logger.debug("smdebug: no writer process (%s: %s); writing on threads", type(exc).__name__, exc)
            self._gone = f"it could not start: {exc}"
            self._stop_child(kill=True)

    def _spawn(self) -> None:
        env = dict(os.environ, SMDEBUG_DISABLE="1")  # the child imports no framework: nothing to activate
        # this very smdebug, whatever put it on this process's path (looked for after the child's own)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        code = f"import sys; sys.path.append({root!r}); from smdebug.writer_process import main; sys.exit(main())"
        try:
            self._ring = _Ring(RING_BYTES) if hasattr(os, "memfd_create") else None
        except OSError:  # no shared memory: every byte goes down the pipe
            self._ring = None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,  # a Ctrl-C meant for training must not stop the child mid-write
                pass_fds=(self._ring.fd,) if self._ring is not None else (),
            )
        finally:
            if self._ring is not None:
                os.close(self._ring.fd)  # the child has its own; this process keeps the mapping
        self._fd = self._proc.stdin.fileno()
        try:
            fcntl.fcntl(self._fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:
            pass
        threading.Thread(
            target=self._listen, name=f"smdebug-writer-replies-{self.worker}", daemon=True
        ).start()
        start = {
            "uri": self._uri,
            "worker": self.worker,
            "max_queue_bytes": self.max_queue_bytes,
            "close_timeout": self.close_timeout,
            "claim_token": self._claim_token,  # the claim is this process's writer's, made already
            "log_level": logger.getEffectiveLevel(),
            "ring": [self._ring.fd, len(self._ring.map)] if self._ring is not None else None,
        }
        self._write_all(_message(["start", start]))

    def _listen(self) -> None:
        """The reply thread: the child's answers and log records, until it exits."""
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "log" in msg:
                logger.log(msg["log"][0], "%s", msg["log"][1])
            elif "ready" in msg:
                self._ready = True
            else:
                with self._cond:
                    self._replies[msg["id"]] = msg
                    self._cond.notify_all()
        with self._cond:
            if self._gone is None:
                self._gone = f"it exited with code {self._proc.wait()}"
            self._cond.notify_all()

    def _local_takes(self, step: int) -> bool:
        """Whether an item of ``step`` goes to this process's writer. The first item of a new step hands
        over to a ready child: no step is written by both (a step written again is replaced whole)."""
        if self._local is None:
            return False
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
        elif self._failed_steps or self._failed_files:
            self._send(request=["failed", self._failed_steps, self._failed_files])

    def _request(self, kind: str, *args, wait: float) -> dict | None:
        """Send a request after everything queued; the child's answer, or None when it gave none."""
        self._next_id += 1
        ident = self._next_id
        self._send(request=[kind, ident, *args])
        if self._local is not None:
            return None
        deadline = time.monotonic() + wait
        with self._cond:
            while ident not in self._replies and self._gone is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            reply = self._replies.pop(ident, None)
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
        if self._local_takes(step):
            self._local.write_tensor(step, mode, mode_step, name, array, wall_time, reserved)
            return
        wall_time = time.time() if wall_time is None else wall_time
        self._batch.append(("tensor", step, mode, mode_step, name, array, wall_time))
        self._batch_bytes += array.nbytes
        if self._batch_bytes >= BATCH_BYTES:
            self._send()

    takes_views = True

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
        reserved = view.nbytes if view.nbytes >= RESERVE_BYTES else 0
        if reserved:  # the copy is made once the queue has room for it (as the hook does)
            self.reserve(reserved)
        self.write_tensor(step, mode, mode_step, name, view.copy(), wall_time, reserved)

    def write_scalars(self, step, mode, mode_step, names, values, wall_time) -> None:
        self._step_has_data = True
        if self._local_takes(step):
            self._local.write_scalars(step, mode, mode_step, names, values, wall_time)
        else:
            self._batch.append(("scalars", step, mode, mode_step, names, values, wall_time))

    def write_shape(self, step, mode, mode_step, name, shape) -> None:
        self._step_has_data = True
        if self._local_takes(step):
            self._local.write_shape(step, mode, mode_step, name, shape)
        else:
            self._batch.append(("shape", step, mode, mode_step, name, list(shape)))

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
            self._send()
            return
        self._local.end_step(step)
        if wrote and self._proc is None and self._gone is None and not self._forked():
            self._steps_written += 1
            if self._steps_written >= SPAWN_AFTER_STEPS:
                self._start()

    def write_file(self, relpath: str, data: bytes) -> None:
        if self._local is not None:
            self._local.write_file(relpath, data)
        else:
            self._batch.append(("file", relpath, data))
            self._send()

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

    def close(self, timeout: float | None = None, end_of_job: bool = False) -> dict[int, str]:
        if self._closed or self._forked():
            return self.failed_steps
        self._closed = True
        timeout = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if self._local is None:
            reply = self._request("close", timeout, end_of_job, wait=timeout + REPLY_GRACE)
            if reply is not None:
                self._stop_child()
                self._ring = None  # unmapped here (a process that makes many hooks keeps none of them)
                return self.failed_steps
            self._take_over()  # gone or hung: this process finishes the run
        self._stop_child()  # started, not yet handed over: it has nothing
        self._ring = None
        self._local.close(max(0.0, deadline - time.monotonic()), end_of_job)
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

    def _forked(self) -> bool:
        """A forked copy of the training process (a data loader's worker): the pipe is its parent's, so
        this copy writes nothing, as a thread writer's copy would (its threads are not in the fork)."""
        return _pid[0] != self._pid

    # -- sending ------------------------------------------------------------------------------------
    def _send(self, request: list | None = None) -> None:
        """Send the step's batch (and a request after it) to the child."""
        if self._forked():
            self._batch, self._batch_bytes = [], 0
            return
        items, self._batch, self._batch_bytes = self._batch, [], 0
        if self._local is not None:
            _feed(self._local, items)
            return
        if self._gone is not None:
            self._take_over(unsent=items)
            return
        try:
            if items:
                header, buffers = _encode(items, self._names)
                ring = self._ring
                if ring is None:
                    self._write_all(_message(["items", header], buffers))
                else:  # the child gives back the ring up to all that was put in it so far, once it has read
                    nbytes = sum(memoryview(b).nbytes for b in buffers)
                    shared = ring.put(buffers, nbytes) if nbytes else None
                    message = ["items", header, shared, ring.used]
                    self._write_all(_message(message) if shared else _message(message, buffers))
                self._sent_steps.update(_steps(items))
                items = []  # the child has them
            if request is not None:
                self._write_all(_message(request))
        except _Gone as exc:
            with self._cond:
                self._gone = self._gone or str(exc)
            self._take_over(unsent=items)  # a message cut short is never read by the child

    def _write_all(self, parts: list) -> None:
        """Write every part to the child's pipe; _Gone when the child exited. While the child's queue
        is full the pipe takes nothing and training waits, as for the thread writer: nothing is dropped."""
        views = [view.cast("B") for view in map(memoryview, parts) if view.nbytes]
        while views:
            try:
                written = os.writev(self._fd, views[:_IOV_MAX])
            except OSError as exc:  # BrokenPipeError: the child exited
                raise _Gone(f"it stopped reading ({type(exc).__name__})") from None
            while written:  # a signal may end a write part way
                if written >= views[0].nbytes:
                    written -= views.pop(0).nbytes
                else:
                    views[0] = views[0][written:]
                    written = 0

    # -- when the child is gone ---------------------------------------------------------------------
    def _take_over(self, unsent: list = ()) -> None:
        """Write in this process from now on: the items not yet given to the child go to a RunWriter
        here; steps the child had and did not write are reported unsaved."""
        if self._local is not None:
            return
        self._stop_child(kill=True)
        try:
            store = self._store() if callable(self._store) else self._store
        except Exception:  # the RunWriter reports why it cannot open it
            store = None
        lost = {}
        for step in sorted(self._sent_steps):
            try:
                written = store is not None and store.exists(index_file_path(step, self.worker))
            except Exception:
                written = False
            if not written:
                lost[step] = f"the writer process stopped before writing it ({self._gone})"
        if self._sent_steps:
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
            self.close_timeout,
            uri=self._uri,
            claim_token=self._claim_token,  # the name is claimed already, by this process's first writer
        )
        self._local.failed_steps.update({**self._failed_steps, **lost})
        self._local.failed_files.update(self._failed_files)
        self._local.written_steps.extend(self._written)
        items = [_owned(item, self._ring) for item in [*unsent, *self._batch]]
        self._batch = []
        _feed(self._local, [item for item in items if item[0] == "file" or item[1] not in lost])

    def _stop_child(self, kill: bool = False) -> None:
        proc = self._proc
        if proc is None or self._forked():
            return
        try:
            proc.stdin.close()  # end of file: a child still reading exits
        except OSError:
            pass
        try:
            if kill:
                proc.kill()
            proc.wait(REPLY_GRACE)
        except Exception:
            proc.kill()


# -- the messages -----------------------------------------------------------------------------------
def _message(header: list, buffers: list = ()) -> list:
    head = json.dumps(header, separators=(",", ":")).encode()
    size = sum(b.nbytes if isinstance(b, np.ndarray) else len(b) for b in buffers)
    return [_FRAME.pack(len(head), size), head, *buffers]


def _owned(item: tuple, ring: _Ring | None) -> tuple:
    """A batch item with its array out of the ring, for a writer in this process."""
    if item[0] == "tensor" and isinstance(item[5], _InRing):
        return (*item[:5], item[5].copy(ring), *item[6:])
    return item


def _steps(items: list) -> set[int]:
    return {item[1] for item in items if item[0] != "file"}


class _Names:
    """Numbers for a tensor's lists of reduction names (the same list objects step after step): each is
    sent once, then by its number. Holding the lists keeps their ids from being reused."""

    LIMIT = 100_000  # lists remembered before starting over (plans made again as due collections change)

    def __init__(self):
        self.numbers: dict[int, tuple[list, int]] = {}

    def ids(self, names: list[list[str]]) -> tuple[list[int], list]:
        """The numbers of these lists, and [number, list] of those the child has not seen yet."""
        numbers, ids, new = self.numbers, [], []
        for some in names:
            known = numbers.get(id(some))
            if known is None:
                if len(numbers) >= self.LIMIT:
                    numbers.clear()
                known = numbers[id(some)] = (some, len(numbers))
                new.append([known[1], some])
            ids.append(known[1])
        return ids, new


def _encode(items: list, names_table: _Names) -> tuple[list, list]:
    """RunWriter batch items as JSON-able descriptions and the buffers of their payload, in order."""
    header, buffers = [], []
    for item in items:
        kind = item[0]
        if kind == "tensor":
            _, step, mode, mode_step, name, array, wall_time = item
            if isinstance(array, _InRing):  # its bytes are in the ring already
                where = [array.dtype.str, array.shape, wall_time, array.position]
                header.append(["t", step, mode.value, mode_step, name, *where])
                continue
            if array.dtype.kind == "O":
                described = _strings(array)
                if described is None:  # what RunWriter says of an element it cannot encode
                    logger.warning("smdebug: could not encode %s at step %d: not text", name, step)
                    continue
                kinds, chunks = described
                header.append(["o", step, mode.value, mode_step, name, array.shape, kinds, wall_time])
                buffers.extend(chunks)
                continue
            if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
                array = array.copy(order="C")
            header.append(["t", step, mode.value, mode_step, name, array.dtype.str, array.shape, wall_time])
            buffers.append(array)
        elif kind == "scalars":
            _, step, mode, mode_step, names, values, wall_time = item
            ids, new = names_table.ids(names)
            if isinstance(values, np.ndarray) and values.ndim == 2 and values.dtype.kind in "fiub":
                # a [results, reductions] matrix (smdebug_to_host's bulk answer): already one buffer
                sizes, dtypes, values = [values.shape[1]] * len(values), values.dtype.str, [values]
            elif (
                values
                and values[0].dtype.kind in "fiub"
                and all(v.dtype == values[0].dtype and v.ndim == 1 for v in values)
            ):
                sizes = [v.size for v in values]
                dtypes, values = values[0].dtype.str, [np.concatenate(values)]  # rows of a result matrix
            else:  # results of different dtypes each keep theirs
                sizes = [v.size for v in values]
                dtypes = [v.dtype.str for v in values]
                values = [np.ascontiguousarray(v) for v in values]
            header.append(["s", step, mode.value, mode_step, ids, new, dtypes, sizes, wall_time])
            buffers.extend(values)
        elif kind == "shape":
            header.append(["h", item[1], item[2].value, item[3], item[4], item[5]])
        elif kind == "end":
            header.append(["e", item[1]])
        else:  # file
            header.append(["f", item[1], len(item[2])])
            buffers.append(item[2])
    return header, buffers


def _strings(array: np.ndarray) -> tuple[list, list] | None:
    """An object array of str and bytes elements: their kinds and lengths, and their bytes."""
    kinds, chunks = [], []
    for s in array.reshape(-1):
        if isinstance(s, str):
            chunk = s.encode("utf-8", "surrogatepass")
            kinds.append(["s", len(chunk)])
        elif isinstance(s, bytes):
            chunk = s
            kinds.append(["b", len(chunk)])
        else:
            return None
        chunks.append(chunk)
    return kinds, chunks


def _feed(writer: RunWriter, items: list) -> None:
    for item in items:
        kind = item[0]
        if kind == "tensor":
            writer.write_tensor(*item[1:])
        elif kind == "scalars":
            writer.write_scalars(*item[1:])
        elif kind == "shape":
            writer.write_shape(*item[1:])
        elif kind == "end":
            writer.end_step(item[1])
        else:
            writer.write_file(item[1], item[2])


# -- the child process ------------------------------------------------------------------------------
class _Replies:
    """The child's side of the reply pipe: JSON lines, written whole from any of its threads."""

    def __init__(self, fd: int):
        self.fd = fd
        self.lock = threading.Lock()

    def send(self, msg: dict) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        with self.lock:
            try:
                while data:
                    data = data[os.write(self.fd, data) :]
            except BrokenPipeError:  # training died: what it sent is still written, unanswered
                pass


class _Forward(logging.Handler):
    """The child's log records, logged again by the training process (where the user sees them)."""

    def __init__(self, replies: _Replies):
        super().__init__()
        self.replies = replies

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.replies.send({"log": [record.levelno, record.getMessage()]})
        except Exception:
            pass


def _read_exact(fd: int, n: int) -> bytearray | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        chunk = os.readv(fd, [view[got:]])
        if chunk == 0:
            return None
        got += chunk
    return buf


def _read_message(fd: int) -> tuple[list, bytearray] | None:
    frame = _read_exact(fd, _FRAME.size)
    if frame is None:
        return None
    head_len, size = _FRAME.unpack(frame)
    head = _read_exact(fd, head_len)
    payload = _read_exact(fd, size) if size else bytearray()
    if head is None or payload is None:
        return None
    return json.loads(head), payload


def _state(writer: RunWriter, live: bool, reported: list[int]) -> dict:
    """What the training process mirrors; of the written steps only those not reported yet (rules
    flush at every step: the whole list each time would grow with the run)."""
    written = writer.written_steps[reported[0] :]
    reported[0] += len(written)
    return {
        "failed_steps": writer.failed_steps,
        "failed_files": writer.failed_files,
        "written_steps": written,
        "refused": writer.refused,
        "pending_steps": writer.pending_steps if live else [],
        "failing": writer.failing,
    }


def _give(writer: RunWriter, header: list, payload: bytearray, names: dict, ring: mmap.mmap | None) -> None:
    offset = 0
    for item in header:
        kind = item[0]
        if kind == "t":
            _, step, mode, mode_step, name, dtype, shape, wall_time, *in_ring = item
            dtype = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            if in_ring:  # copied out: the training process reuses that room once this message is read
                array = np.frombuffer(ring, dtype, count, in_ring[0]).reshape(shape).copy()
            else:
                array = np.frombuffer(payload, dtype, count, offset).reshape(shape)
                offset += count * dtype.itemsize
            writer.write_tensor(step, ModeKeys(mode), mode_step, name, array, wall_time)
        elif kind == "o":
            _, step, mode, mode_step, name, shape, kinds, wall_time = item
            elements = []
            for which, size in kinds:
                chunk = bytes(payload[offset : offset + size])
                offset += size
                elements.append(chunk.decode("utf-8", "surrogatepass") if which == "s" else chunk)
            array = np.empty(len(elements), dtype=object)
            array[:] = elements
            writer.write_tensor(step, ModeKeys(mode), mode_step, name, array.reshape(shape), wall_time)
        elif kind == "s":
            _, step, mode, mode_step, ids, new, dtypes, sizes, wall_time = item
            names.update(new)
            values = []
            for dtype, size in zip([dtypes] * len(sizes) if isinstance(dtypes, str) else dtypes, sizes):
                dtype = np.dtype(dtype)
                values.append(np.frombuffer(payload, dtype, size, offset))
                offset += size * dtype.itemsize
            writer.write_scalars(step, ModeKeys(mode), mode_step, [names[i] for i in ids], values, wall_time)
        elif kind == "h":
            writer.write_shape(item[1], ModeKeys(item[2]), item[3], item[4], item[5])
        elif kind == "e":
            writer.end_step(item[1])
        elif kind == "f":
            writer.write_file(item[1], bytes(payload[offset : offset + item[2]]))
            offset += item[2]


def main() -> int:
    replies = _Replies(os.dup(1))
    os.dup2(2, 1)  # whatever prints goes to stderr, never into the replies
    started = _read_message(0)
    if started is None:
        return 0
    options = started[0][1]
    log = logging.getLogger("smdebug")
    log.handlers[:] = [_Forward(replies)]
    log.propagate = False
    log.setLevel(options["log_level"])
    uri = options["uri"]
    writer = RunWriter(
        lambda: Store(uri),
        options["worker"],
        options["max_queue_bytes"],
        options["close_timeout"],
        uri=uri,
        claim_token=options["claim_token"],
    )
    ring = None
    if options.get("ring"):
        fd, size = options["ring"]
        ring = mmap.mmap(fd, size)
        os.close(fd)
    replies.send({"ready": True})
    names: dict[int, list[str]] = {}  # the lists of reduction names by their numbers
    reported = [0]  # written steps the training process was told of
    while True:
        msg = _read_message(0)
        if msg is None:  # the training process ended without closing: no end-of-job marker
            writer.close(end_of_job=False, finish_open_step=False)
            return 0
        header, payload = msg
        kind = header[0]
        if kind == "items":
            if len(header) > 2 and header[2]:  # the rest of the arrays' bytes, in the ring: copied out
                position, nbytes = header[2]
                payload = bytearray(nbytes)
                with memoryview(ring) as shared:
                    payload[:] = shared[position : position + nbytes]
            _give(writer, header[1], payload, names, ring)
            if len(header) > 2:  # everything the training process put in the ring so far is read
                _RING_READ.pack_into(ring, 0, header[3])
        elif kind == "flush":
            done = writer.flush(header[2])
            replies.send({"id": header[1], "result": done, "state": _state(writer, True, reported)})
        elif kind == "failed":  # what the training process's own writer could not save
            writer.failed_steps.update({int(k): v for k, v in header[1].items()})
            writer.failed_files.update(header[2])
        elif kind == "status":
            replies.send({"id": header[1], "state": _state(writer, True, reported)})
        elif kind == "close":
            writer.close(header[2], end_of_job=header[3])
            replies.send({"id": header[1], "state": _state(writer, False, reported)})
            return 0


if __name__ == "__main__":
    sys.exit(main())
