"""The run's writer in a process of its own, for a local out_dir.

RunWriter's encoding and file publishing is Python. In the training process it holds the GIL, and the
training thread waits for it each time it comes back from a kernel or a system call: on a fast step that
wait costs more than the work itself. Here a child process (``python -m smdebug.writer_process``) runs the
RunWriter on another core. The training thread sends a step's items down a pipe at the step's end, in one
vectored write: a JSON header, then the arrays' bytes as they are. The child answers flush, close and status
requests and forwards its log records on a second pipe, read by a thread that sleeps until it speaks.

Nothing is lost when the child cannot start or dies. Items wait in this process until the child says it
is ready; a RunWriter on threads in this process takes over when it is gone, and the steps handed to it
whose index file is not in the run are reported unsaved (the run records them, as any unsaved step). A
training process that dies leaves the child an end of file: it publishes the finished steps it has, drops
the unfinished one and writes no end-of-job marker. SMDEBUG_WRITER_PROCESS=0 keeps the writer on threads.
"""

from __future__ import annotations

import json
import logging
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
    RunWriter,
    _Claim,
    close_timeout_from_env,
    max_queue_bytes_from_env,
    unsaved_report,
)

logger = logging.getLogger("smdebug")

ENV = "SMDEBUG_WRITER_PROCESS"
START_TIMEOUT = 30.0  # seconds items may wait for the child to start before this process writes them
REPLY_GRACE = 5.0  # seconds beyond a request's own timeout that the child may take to answer
_FRAME = struct.Struct("<II")  # header length, payload length
_IOV_MAX = 512  # buffers per writev call (Linux allows 1024)
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux's numbers, where fcntl does not name them
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
_PIPE_BYTES = 1024 * 1024  # a step's items fit in the pipe: the training thread rarely waits on the child


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


class _Gone(Exception):
    """The child process cannot take more: it exited."""


class ProcessWriter:
    """RunWriter's interface for the training thread, with the RunWriter itself in a child process."""

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
        self.worker = worker
        self.max_queue_bytes = max_queue_bytes or max_queue_bytes_from_env()
        self.close_timeout = close_timeout_from_env() if close_timeout is None else close_timeout
        self.failed_steps: dict[int, str] = {}
        self.failed_files: dict[str, str] = {}
        self.written_steps: list[int] = []
        self.refused: str | None = None
        self._store = store
        self._claim, self._claim_token = claim, claim_token
        self._batch: list = []  # RunWriter's batch items of the step, sent at its end
        self._batch_bytes = 0
        self._step_has_data = False
        # Until the child says it is ready, what fits in the pipe is sent (and kept here, to be written by
        # this process should the child never start), and the rest waits here.
        self._early: list = []
        self._early_bytes = 0
        self._backlog: list = []
        self._backlog_bytes = 0
        self._child_ready = False  # the child said it is ready (set by the reply thread)
        self._sent_steps: set[int] = set()  # steps the child was given items of
        self._fallback: RunWriter | None = None
        self._closed = False
        self._pid = os.getpid()
        self._ready = threading.Event()
        self._replies: dict[int, dict] = {}
        self._cond = threading.Condition()
        self._gone: str | None = None
        self._next_id = 0
        self._names = _Names()
        self._proc: subprocess.Popen | None = None
        try:
            self._claim_now()
            self._start(uri)
        except Exception as exc:  # no child: this process writes (nothing was given to a child yet)
            logger.debug("smdebug: no writer process (%s: %s); writing on threads", type(exc).__name__, exc)
            self._gone = f"it could not start: {exc}"
            self._take_over()

    # -- the child ----------------------------------------------------------------------------------
    def _claim_now(self) -> None:
        """Claim the worker's name in the run here and now (a file created in a local folder), not once
        the child has started: another worker finishing the run meanwhile would have the claim refused."""
        if self._claim is None:
            return
        if callable(self._store):
            self._store = self._store()
        _Claim(self.worker, *self._claim).publish(self._store)
        self._claim = None  # ours: the child writes under it

    def _start(self, uri: str) -> None:
        env = dict(os.environ, SMDEBUG_DISABLE="1")  # the child imports no framework: nothing to activate
        # this very smdebug, whatever put it on this process's path (looked for after the child's own)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        code = f"import sys; sys.path.append({root!r}); from smdebug.writer_process import main; sys.exit(main())"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C meant for training must not stop the child mid-write
        )
        self._fd = self._proc.stdin.fileno()
        try:
            fcntl.fcntl(self._fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:
            pass
        try:
            self._early_budget = fcntl.fcntl(self._fd, _F_GETPIPE_SZ) // 2
        except OSError:
            self._early_budget = 32 * 1024
        threading.Thread(
            target=self._listen, name=f"smdebug-writer-replies-{self.worker}", daemon=True
        ).start()
        start = {
            "uri": uri,
            "worker": self.worker,
            "max_queue_bytes": self.max_queue_bytes,
            "close_timeout": self.close_timeout,
            "claim": self._claim,
            "claim_token": self._claim_token,
            "log_level": logger.getEffectiveLevel(),
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
                self._child_ready = True
                self._ready.set()
            else:
                with self._cond:
                    self._replies[msg["id"]] = msg
                    self._cond.notify_all()
        with self._cond:
            if self._gone is None:
                self._gone = f"it exited with code {self._proc.wait()}"
            self._cond.notify_all()
        self._ready.set()  # nobody waits for a child that is gone

    def _request(self, kind: str, *args, wait: float) -> dict | None:
        """Send a request after everything queued; the child's answer, or None when it gave none."""
        self._next_id += 1
        ident = self._next_id
        self._send(request=[kind, ident, *args])
        if self._fallback is not None:
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
        self.failed_steps.update({int(k): v for k, v in state["failed_steps"].items()})
        self.failed_files.update(state["failed_files"])
        self.written_steps = state["written_steps"]
        self.refused = state["refused"]

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
        if self._fallback is not None:
            self._fallback.write_tensor(step, mode, mode_step, name, array, wall_time, reserved)
            return
        wall_time = time.time() if wall_time is None else wall_time
        self._step_has_data = True
        self._batch.append(("tensor", step, mode, mode_step, name, array, wall_time))
        self._batch_bytes += array.nbytes
        if self._batch_bytes >= BATCH_BYTES:
            self._send()

    def write_scalars(self, step, mode, mode_step, names, values, wall_time) -> None:
        if self._fallback is not None:
            self._fallback.write_scalars(step, mode, mode_step, names, values, wall_time)
            return
        self._step_has_data = True
        self._batch.append(("scalars", step, mode, mode_step, names, values, wall_time))

    def write_shape(self, step, mode, mode_step, name, shape) -> None:
        if self._fallback is not None:
            self._fallback.write_shape(step, mode, mode_step, name, shape)
            return
        self._step_has_data = True
        self._batch.append(("shape", step, mode, mode_step, name, list(shape)))

    def reserve(self, nbytes: int) -> None:
        """Before a large tensor is copied: what waits here goes first (the child's queue is bounded)."""
        if self._fallback is not None:
            self._fallback.reserve(nbytes)
        elif nbytes > 0:
            self._send()

    def end_step(self, step: int) -> None:
        if self._fallback is not None:
            self._fallback.end_step(step)
            return
        if self._step_has_data:
            self._step_has_data = False
            self._batch.append(("end", step))
        self._send()

    def write_file(self, relpath: str, data: bytes) -> None:
        if self._fallback is not None:
            self._fallback.write_file(relpath, data)
            return
        self._batch.append(("file", relpath, data))
        self._send()

    def flush(self, timeout: float | None = None) -> bool:
        if self._closed or self._forked():
            return True
        timeout = self.close_timeout if timeout is None else timeout
        if self._fallback is None:
            reply = self._request("flush", timeout, wait=timeout + REPLY_GRACE)
            if reply is not None:
                return reply["result"]
            if self._gone is None:
                return False  # no answer in time: the child is still working
            self._take_over()
        return self._fallback.flush(timeout)

    def close(self, timeout: float | None = None, end_of_job: bool = False) -> dict[int, str]:
        if self._closed or self._forked():
            return self.failed_steps
        self._closed = True
        timeout = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if self._fallback is None:
            reply = self._request("close", timeout, end_of_job, wait=timeout + REPLY_GRACE)
            if reply is None:
                self._take_over()  # gone or hung: this process finishes the run
            else:
                self._stop_child()
        if self._fallback is not None:
            self._fallback.close(max(0.0, deadline - time.monotonic()), end_of_job)
            self._merge_fallback()
        return self.failed_steps

    def unsaved_report(self) -> str:
        return unsaved_report(self.failed_steps, self.failed_files)

    @property
    def pending_steps(self) -> list[int]:
        """Finished steps waiting for the store to come back."""
        state = self._status()
        return self._fallback.pending_steps if self._fallback is not None else state["pending_steps"]

    @property
    def failing(self) -> bool:
        """Whether the store is failing (steps wait for a retry)."""
        state = self._status()
        return self._fallback.failing if self._fallback is not None else state["failing"]

    def _status(self) -> dict:
        reply = None if self._fallback is not None else self._request("status", wait=REPLY_GRACE)
        return reply["state"] if reply is not None else {"pending_steps": [], "failing": False}

    def _forked(self) -> bool:
        """A forked copy of the training process (a data loader's worker): the pipe is its parent's, so
        this copy writes nothing, as a thread writer's copy would (its threads are not in the fork)."""
        return os.getpid() != self._pid

    # -- sending ------------------------------------------------------------------------------------
    def _send(self, request: list | None = None) -> None:
        """Send the step's batch (and a request after it) to the child, or keep it until it is ready."""
        if self._forked():
            self._batch, self._batch_bytes = [], 0
            return
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if self._fallback is not None:
            _feed(self._fallback, batch)
            return
        if not self._ready.is_set() and (
            self._backlog or self._early_bytes + _size(batch) > self._early_budget
        ):
            self._backlog.extend(batch)
            self._backlog_bytes += _size(batch)
            batch = []
            if self._backlog_bytes < self.max_queue_bytes and request is None and self._gone is None:
                return  # the child is starting: the items wait here meanwhile
            if not self._ready.wait(START_TIMEOUT):
                with self._cond:
                    self._gone = self._gone or f"it did not start within {START_TIMEOUT:g} s"
        if self._gone is not None:
            self._take_over(unsent=batch)
            return
        ready = self._child_ready
        if ready and self._early:
            self._sent_steps.update(_steps(self._early))
            self._early, self._early_bytes = [], 0
        items = [*self._backlog, *batch]
        self._backlog, self._backlog_bytes = [], 0
        try:
            if items:
                header, buffers = _encode(items, self._names)
                self._write_all(_message(["items", header], buffers))
                if ready:
                    self._sent_steps.update(_steps(items))
                else:
                    self._early.extend(items)
                    self._early_bytes += _size(items)
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
        """Write on threads in this process from now on: the items not yet given to the child go to a
        RunWriter here; steps the child had and did not write are reported unsaved."""
        if self._fallback is not None:
            return
        self._stop_child(kill=True)
        early, self._early = self._early, []
        if self._child_ready:  # the child may have written them
            self._sent_steps.update(_steps(early))
            early = []
        try:
            store = self._store() if callable(self._store) else self._store
        except Exception:  # the fallback writer reports why it cannot open it
            store = None
        lost = {}
        for step in sorted(self._sent_steps):
            try:
                written = store is not None and store.exists(index_file_path(step, self.worker))
            except Exception:
                written = False
            if not written:
                lost[step] = f"the writer process stopped before writing it ({self._gone})"
        if self._sent_steps or self._gone and "could not start" not in self._gone:
            logger.warning(
                "smdebug: the writer process of %s stopped (%s); writing in the training process from now on%s",
                self.uri,
                self._gone,
                f"; {len(lost)} step(s) it had not written are lost" if lost else "",
            )
        claim = self._claim if not self._sent_steps else None  # the child claimed the worker's name first
        self._fallback = RunWriter(
            store if store is not None else self._store,
            self.worker,
            self.max_queue_bytes,
            self.close_timeout,
            uri=self.uri,
            claim=claim,
            claim_token=self._claim_token,
        )
        self._fallback.failed_steps.update(lost)
        self._fallback.written_steps.extend(self.written_steps)
        items = [*early, *unsent, *self._backlog, *self._batch]
        self._backlog, self._batch = [], []
        _feed(self._fallback, [item for item in items if item[0] == "file" or item[1] not in lost])

    def _merge_fallback(self) -> None:
        fallback = self._fallback
        self.failed_steps, self.failed_files = fallback.failed_steps, fallback.failed_files
        self.written_steps, self.refused = fallback.written_steps, fallback.refused

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


def _size(items: list) -> int:
    return sum(item[5].nbytes for item in items if item[0] == "tensor")


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
            sizes = [v.size for v in values]
            dtype = values[0].dtype if values else None
            if (
                dtype is not None
                and dtype.kind in "fiub"
                and all(v.dtype == dtype and v.ndim == 1 for v in values)
            ):
                dtypes, values = dtype.str, [np.concatenate(values)]  # rows of a result matrix: one buffer
            else:  # results of different dtypes each keep theirs
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


def _state(writer: RunWriter, live: bool) -> dict:
    return {
        "failed_steps": writer.failed_steps,
        "failed_files": writer.failed_files,
        "written_steps": writer.written_steps,
        "refused": writer.refused,
        "pending_steps": writer.pending_steps if live else [],
        "failing": writer.failing,
    }


def _give(writer: RunWriter, header: list, payload: bytearray, names: dict) -> None:
    offset = 0
    for item in header:
        kind = item[0]
        if kind == "t":
            _, step, mode, mode_step, name, dtype, shape, wall_time = item
            dtype = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
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
    claim = options["claim"]
    writer = RunWriter(
        lambda: Store(uri),
        options["worker"],
        options["max_queue_bytes"],
        options["close_timeout"],
        uri=uri,
        claim=tuple(claim) if claim else None,
        claim_token=options["claim_token"],
    )
    replies.send({"ready": True})
    names: dict[int, list[str]] = {}  # the lists of reduction names by their numbers
    while True:
        msg = _read_message(0)
        if msg is None:  # the training process ended without closing: no end-of-job marker
            writer.close(end_of_job=False, finish_open_step=False)
            return 0
        header, payload = msg
        kind = header[0]
        if kind == "items":
            _give(writer, header[1], payload, names)
        elif kind == "flush":
            done = writer.flush(header[2])
            replies.send({"id": header[1], "result": done, "state": _state(writer, True)})
        elif kind == "status":
            replies.send({"id": header[1], "state": _state(writer, True)})
        elif kind == "close":
            writer.close(header[2], end_of_job=header[3])
            replies.send({"id": header[1], "state": _state(writer, False)})
            return 0


if __name__ == "__main__":
    sys.exit(main())
