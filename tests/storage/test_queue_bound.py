"""The queue bound counts every byte a writer holds for the user (names, headers, per-record overhead),
not only arrays' bytes: many small records with long names make training wait as large tensors do."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
from test_writer import GatedStore

from smdebug.modes import ModeKeys
from smdebug.store import Store
from smdebug.writing import ProcessWriter, RunWriter

BOUND = 64 * 1024
NAME = "n" * 200


def train(writer, records: int, done: list) -> threading.Thread:
    def run():
        one = np.ones(1, dtype=np.float32)  # 4 bytes of array: the name and the record are the rest
        for i in range(records):
            writer.write_tensor(0, ModeKeys.TRAIN, 0, f"{NAME}{i}", one)
            done.append(i)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_thread_writer_counts_names_and_records(tmp_path):
    store = GatedStore(str(tmp_path / "run"))
    writer = RunWriter(store, "worker_0", max_queue_bytes=BOUND)
    done: list = []
    trainer = train(writer, 2000, done)  # 2000 records of ~0.7 KB: 1.4 MB held, 8 KB of arrays
    trainer.join(2.0)
    assert trainer.is_alive(), "training should wait: the records held pass the bound"
    assert len(done) < BOUND // 700 + 2 and writer.queued_bytes <= BOUND
    store.gate.set()
    trainer.join(60)
    assert not trainer.is_alive()
    writer.end_step(0)
    assert writer.close() == {}


def test_process_writer_sends_a_step_on_before_it_holds_more_than_the_bound(tmp_path):
    out = str(tmp_path / "run")
    writer = ProcessWriter(Store(out), "worker_0", max_queue_bytes=BOUND, close_timeout=5, uri=out)
    value, step, deadline = np.ones(1, dtype=np.float32), 0, time.monotonic() + 60
    while writer._local is not None:  # steps go to the child once it is ready
        assert time.monotonic() < deadline, "the writer process never took over"
        writer.write_tensor(step, ModeKeys.TRAIN, step, "w", value)
        writer.end_step(step)
        step += 1
        time.sleep(0.01)
    os.kill(writer._proc.pid, signal.SIGSTOP)  # the child reads nothing: what is sent waits in the pipe
    try:
        done: list = []

        def one_step():
            for i in range(20_000):  # one step of 20,000 records: ~14 MB held if never sent on
                writer.write_tensor(step, ModeKeys.TRAIN, step, f"{NAME}{i}", value)
                done.append(i)

        trainer = threading.Thread(target=one_step, daemon=True)
        trainer.start()
        trainer.join(3.0)
        assert trainer.is_alive(), "training should wait for the child instead of holding the step"
        assert writer._batch_bytes < BOUND + 1024
    finally:
        os.kill(writer._proc.pid, signal.SIGCONT)
    trainer.join(120)
    assert not trainer.is_alive() and len(done) == 20_000
    writer.end_step(step)
    assert writer.close(end_of_job=True) == {}
