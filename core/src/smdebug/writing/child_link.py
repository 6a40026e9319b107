"""The writer process's lifecycle, from the training process (a part of ProcessWriter): whether a run can
have one, starting the child (smdebug.writing.child) with its pipes and shared ring, the thread that
reads its answers and log records, waiting for an answer, and stopping it. A forked copy of the training
process (a data loader's worker) leaves the child alone: the pipe is its parent's."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time

try:
    import fcntl
except ImportError:  # not a POSIX system: the writer stays on threads
    fcntl = None

from smdebug.store import Store
from smdebug.writing.settings import writer_process_allowed
from smdebug.writing.wire import Mailboxes, Ring, message, write_all

logger = logging.getLogger("smdebug")

REPLY_GRACE = 5.0  # seconds beyond a request's own timeout that the child may take to answer
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux's number, where fcntl does not name it
_PIPE_BYTES = 1024 * 1024  # a step's items fit in the pipe: the training thread rarely waits on the child
MAIL_BYTES = 256 * 1024  # a shared box of finished steps' messages (two of them), a few steps of reductions

# this process's id, kept up to date in forked children without a system call per saved tensor
_pid = [os.getpid()]
if hasattr(os, "register_at_fork"):  # (where it is missing, there is no fork either)
    os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


def _batch_scheduling(pid: int) -> None:
    """Have the child (it waits for its start message: its threads, made later, inherit this) scheduled as
    a batch process. Each step's message wakes it, and a woken normal process preempts the training
    thread on its core (Linux's wakeup preemption: the write then takes ~1 ms instead of ~20 µs); a batch
    one waits for a free core or the end of the running slice. Its share of the CPU is unchanged."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:  # not Linux
        return
    try:
        os.sched_setscheduler(pid, policy, os.sched_param(0))
    except OSError:  # (a sandbox may forbid it): scheduled as before
        pass


class ChildLink:
    """ProcessWriter's child process; the start message uses the writer's uri, worker, queue bound,
    close timeout and claim token."""

    @staticmethod
    def wanted(uri: str, store: Store | None) -> bool:
        """Whether the run at ``uri`` gets a writer process: a local folder in the core's own Store (the
        child writes through one, without loading plugins), unless SMDEBUG_WRITER_PROCESS=0."""
        if not writer_process_allowed() or not sys.executable:
            return False
        if fcntl is None or not hasattr(os, "writev"):
            return False
        if store is not None:
            return type(store) is Store and store.is_local
        return Store.is_plain_local(uri)

    def __init__(self) -> None:
        self._pid = _pid[0]
        self._proc: subprocess.Popen | None = None
        self._ring: Ring | None = None
        self._mail: Mailboxes | None = None
        self._ready = False  # the child said it is ready (set by the reply thread)
        self._gone: str | None = None  # why there is no child (then none is started again)
        self._replies: dict[int, dict] = {}
        self._cond = threading.Condition()
        self._next_id = 0

    def _start(self, ring_bytes: int) -> None:
        """Start the child (it takes over once it says it is ready); this process writes on if it cannot."""
        try:
            self._spawn(ring_bytes)
        except Exception as exc:
            logger.debug("smdebug: no writer process (%s: %s); writing on threads", type(exc).__name__, exc)
            self._gone = f"it could not start: {exc}"
            self._stop_child(kill=True)

    def _spawn(self, ring_bytes: int) -> None:
        env = dict(os.environ, SMDEBUG_DISABLE="1")  # the child imports no framework: nothing to activate
        # this very smdebug, whatever put it on this process's path (looked for after the child's own)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = (
            f"import sys; sys.path.append({root!r}); from smdebug.writing.child import main; sys.exit(main())"
        )
        try:
            self._ring = Ring(ring_bytes) if hasattr(os, "memfd_create") else None
            self._mail = Mailboxes(min(MAIL_BYTES, ring_bytes)) if self._ring is not None else None
        except OSError:  # no shared memory (or only the ring): those bytes go down the pipe
            self._mail = None
        shared = [some.fd for some in (self._ring, self._mail) if some is not None]
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,  # a Ctrl-C meant for training must not stop the child mid-write
                pass_fds=shared,
            )
        finally:
            for fd in shared:
                os.close(fd)  # the child has its own; this process keeps the mappings
        self._fd = self._proc.stdin.fileno()
        try:
            fcntl.fcntl(self._fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:
            pass
        _batch_scheduling(self._proc.pid)
        threading.Thread(
            target=self._listen, name=f"smdebug-writer-replies-{self.worker}", daemon=True
        ).start()
        start = {
            "uri": self._uri,
            "worker": self.worker,
            "max_queue_bytes": self.max_queue_bytes,
            "close_timeout": self._close_timeout,
            "claim_token": self._claim_token,  # the claim is this process's writer's, made already
            "log_level": logger.getEffectiveLevel(),
            "ring": [self._ring.fd, len(self._ring.map)] if self._ring is not None else None,
            "mail": [self._mail.fd, self._mail.size] if self._mail is not None else None,
        }
        write_all(self._fd, message(["start", start]))

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

    def _reply(self, ident: int, wait: float) -> dict | None:
        """The child's answer to request ``ident``, or None when it gave none within ``wait`` seconds."""
        deadline = time.monotonic() + wait
        with self._cond:
            while ident not in self._replies and self._gone is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._replies.pop(ident, None)

    def _mark_gone(self, reason: str) -> None:
        """Say why there is no child, unless the reply thread already did (said before a kill, which the
        reply thread would report as the cause)."""
        with self._cond:
            self._gone = self._gone or reason

    def _forked(self) -> bool:
        """A forked copy of the training process (a data loader's worker): the pipe is its parent's, so
        this copy writes nothing, as a thread writer's copy would (its threads are not in the fork)."""
        return _pid[0] != self._pid

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
