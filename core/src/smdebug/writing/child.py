"""The writer process itself: a RunWriter fed by the training process's messages (smdebug.writing.wire).

It answers flush, close and status requests with what it wrote and could not write, and forwards its log
records to the training process. An end of file (the training process died) publishes the finished steps
it has, drops the unfinished one and writes no end-of-job marker.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import sys
import threading
from array import array

from smdebug.store import Store
from smdebug.writing.thread_writer import RunWriter
from smdebug.writing.wire import RING_READ, Mailboxes, give, messages, read_message


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


def _state(writer: RunWriter, live: bool, reported: list[int]) -> dict:
    """What the training process mirrors; of the written steps only those not reported yet (rules
    flush at every step: the whole list each time would grow with the run)."""
    written = writer.written_steps[reported[0] :].tolist()
    reported[0] += len(written)
    return {
        "failed_steps": writer.failed_steps,
        "failed_files": writer.failed_files,
        "written_steps": written,
        "refused": writer.refused,
        "pending_steps": writer.pending_steps if live else [],
        "failing": writer.failing,
    }


def main() -> int:
    replies = _Replies(os.dup(1))
    os.dup2(2, 1)  # whatever prints goes to stderr, never into the replies
    started = read_message(0)
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
    # only told to the training process: 8 bytes a step, not a list of int objects (~36)
    writer.written_steps = array("q")
    ring = mail = None
    if options.get("ring"):
        fd, size = options["ring"]
        ring = mmap.mmap(fd, size)
        os.close(fd)
    if options.get("mail"):
        mail = Mailboxes(options["mail"][1], fd=options["mail"][0])
        os.close(mail.fd)
    replies.send({"ready": True})
    names: dict[int, list[str]] = {}  # the lists of reduction names by their numbers

    def items(header: list, payload) -> None:
        if len(header) > 2 and header[2]:  # the rest of the arrays' bytes, in the ring: copied out
            position, nbytes = header[2]
            payload = bytearray(nbytes)
            with memoryview(ring) as shared:
                payload[:] = shared[position : position + nbytes]
        give(writer, header[1], payload, names, ring)
        if len(header) > 2:  # everything the training process put in the ring so far is read
            RING_READ.pack_into(ring, 0, header[3])

    reported = [0]  # written steps the training process was told of
    while True:
        msg = read_message(0)
        if msg is None:  # the training process ended without closing: no end-of-job marker
            for header, payload in messages(mail.left() if mail is not None else b""):
                items(header, payload)  # the steps it finished and had not announced yet
            writer.close(end_of_job=False, finish_open_step=False)
            return 0
        header, payload = msg
        kind = header[0]
        if kind == "items":
            items(header, payload)
        elif kind == "mail":  # finished steps' messages, in the shared boxes
            for mailed, payload in messages(mail.take(*header[1:])):
                items(mailed, payload)
        elif kind == "flush":
            done = writer.flush(header[2])
            replies.send({"id": header[1], "result": done, "state": _state(writer, True, reported)})
        elif kind == "failed":  # what the training process's own writer could not save
            writer.failed_steps.update({int(k): v for k, v in header[1].items()})
            writer.failed_files.update(header[2])
        elif kind == "before":  # the steps the training process's own writer wrote
            writer.written_before(header[1])
        elif kind == "status":
            replies.send({"id": header[1], "state": _state(writer, True, reported)})
        elif kind == "close":
            writer.close(header[2], end_of_job=header[3])
            replies.send({"id": header[1], "state": _state(writer, False, reported)})
            return 0


if __name__ == "__main__":
    sys.exit(main())
