"""Off-thread writing of steps in smdebug's layout.

The training thread only queues host numpy arrays; encoding and I/O happen on one background thread.
The queue is bounded in bytes: when it is full the training thread waits, nothing is dropped. A
step's index file is written only after its event file is complete, so readers never see half a step.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from smdebug import codec
from smdebug.modes import ModeKeys
from smdebug.store import Store

logger = logging.getLogger("smdebug")

DEFAULT_MAX_QUEUE_BYTES = 256 * 1024 * 1024
END_OF_JOB_FILE = "training_job_end.ts"


def event_file_path(step: int, worker: str) -> str:
    return f"events/{step:012d}/{step:012d}_{worker}.tfevents"


def index_file_path(step: int, worker: str) -> str:
    return f"index/{step // 1000:09d}/{step:012d}_{worker}.json"


def collections_file_path(worker: str) -> str:
    return f"collections/000000000/{worker}_collections.json"


def max_queue_bytes_from_env() -> int:
    raw = os.environ.get("SMDEBUG_MAX_QUEUE_BYTES")
    return int(raw) if raw else DEFAULT_MAX_QUEUE_BYTES


@dataclass
class _OpenStep:
    step: int
    mode: ModeKeys
    mode_step: int
    handle: object = None
    offset: int = 0
    tensors: list = field(default_factory=list)
    shapes: list = field(default_factory=list)
    failed: bool = False


class RunWriter:
    """Writes the steps of one worker to a Store from a background thread."""

    def __init__(self, store: Store, worker: str, max_queue_bytes: int | None = None):
        self.store = store
        self.worker = worker
        self.max_queue_bytes = max_queue_bytes or max_queue_bytes_from_env()
        self.failed_steps: dict[int, str] = {}
        self.written_steps: list[int] = []
        self._queue: queue.Queue = queue.Queue()
        self._queued_bytes = 0
        self._room = threading.Condition()
        self._open: _OpenStep | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"smdebug-writer-{worker}", daemon=True)
        self._thread.start()

    # -- training thread ----------------------------------------------------------------------------
    def write_tensor(self, step: int, mode: ModeKeys, mode_step: int, name: str, array: np.ndarray) -> None:
        nbytes = int(array.nbytes)
        with self._room:
            # Wait for room, but always admit one item into an empty queue however large it is.
            while self._queued_bytes and self._queued_bytes + nbytes > self.max_queue_bytes:
                self._room.wait()
            self._queued_bytes += nbytes
        self._queue.put(("tensor", step, mode, mode_step, name, array, time.time(), nbytes))

    def write_shape(self, step: int, mode: ModeKeys, mode_step: int, name: str, shape) -> None:
        self._queue.put(("shape", step, mode, mode_step, name, list(shape)))

    def end_step(self, step: int) -> None:
        self._queue.put(("end", step))

    def write_file(self, relpath: str, data: bytes) -> None:
        self._queue.put(("file", relpath, data))

    def flush(self) -> None:
        done = threading.Event()
        self._queue.put(("flush", done))
        done.wait()

    def close(self) -> dict[int, str]:
        """Write everything queued and stop the thread; returns the steps that could not be saved."""
        if not self._closed:
            self._closed = True
            self._queue.put(("stop",))
            self._thread.join()
        return self.failed_steps

    # -- writer thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            kind = item[0]
            try:
                if kind == "tensor":
                    self._tensor(*item[1:7])
                elif kind == "shape":
                    self._shape(*item[1:])
                elif kind == "end":
                    self._finish(item[1])
                elif kind == "file":
                    self._guard(None, self.store.write_bytes, item[1], item[2])
                elif kind == "flush":
                    item[1].set()
                elif kind == "stop":
                    if self._open is not None:
                        self._finish(self._open.step)
                    return
            finally:
                if kind == "tensor":
                    with self._room:
                        self._queued_bytes -= item[7]
                        self._room.notify_all()

    def _step(self, step: int, mode: ModeKeys, mode_step: int) -> _OpenStep:
        if self._open is not None and self._open.step != step:
            self._finish(self._open.step)
        if self._open is None:
            self._open = _OpenStep(step, mode, mode_step)
        return self._open

    def _tensor(self, step, mode, mode_step, name, array, wall_time) -> None:
        st = self._step(step, mode, mode_step)
        if st.failed:
            return

        def write():
            if st.handle is None:
                st.handle = self.store.open_write(event_file_path(step, self.worker))
            record = codec.frame(
                codec.encode_tensor_event(name, array, step, wall_time, mode.value, mode_step)
            )
            st.handle.write(record)
            st.tensors.append({"tensorname": name, "start_idx": st.offset, "length": len(record)})
            st.offset += len(record)

        self._guard(st, write)

    def _shape(self, step, mode, mode_step, name, shape) -> None:
        st = self._step(step, mode, mode_step)
        st.shapes.append({"tensorname": name, "originalname": name, "shape": shape})

    def _finish(self, step: int) -> None:
        st = self._open
        if st is None or st.step != step:
            return
        self._open = None

        def finish():
            if st.handle is not None:
                st.handle.close()
            if st.failed or not (st.tensors or st.shapes):
                return
            meta = {"mode": st.mode.name, "mode_step": st.mode_step}
            if st.tensors:
                meta["event_file_name"] = event_file_path(step, self.worker)
            index = {"meta": meta, "tensor_payload": st.tensors, "shape_payload": st.shapes}
            self.store.write_bytes(index_file_path(step, self.worker), json.dumps(index).encode())
            self.written_steps.append(step)

        self._guard(st, finish)

    def _guard(self, st: _OpenStep | None, fn, *args) -> None:
        """Run one write; a failure is logged once per step and never reaches the training thread."""
        try:
            fn(*args)
        except Exception as exc:
            what = f"step {st.step}" if st is not None else f"file {args[0]}"
            reason = f"{type(exc).__name__}: {exc}"
            if st is not None:
                if not st.failed:
                    logger.warning("smdebug: could not save %s to %s: %s", what, self.store.uri, reason)
                st.failed = True
                self.failed_steps[st.step] = reason
            else:
                logger.warning("smdebug: could not save %s to %s: %s", what, self.store.uri, reason)
