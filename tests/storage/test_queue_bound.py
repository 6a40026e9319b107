"""The queue bound counts every byte a writer holds for the user (names, headers, per-record overhead),
not only arrays' bytes: many small records with long names make training wait as large tensors do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_writer import GatedStore

from smdebug.modes import ModeKeys
from smdebug.store import Store
from smdebug.trials import create_trial
from smdebug.writing import ProcessWriter, RunWriter
from smdebug.writing.wire import Names, encode, give

HERE = Path(__file__).parent
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
    assert len(done) < BOUND // 700 + 2 and writer.held_bytes <= BOUND
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


class SlowStore(Store):
    """A real local Store that is slow, not failing: its publisher waits at a gate before each index."""

    def __init__(self, root):
        super().__init__(root)
        self.gate = threading.Event()

    def write_bytes(self, relpath, data):
        if relpath.startswith("index/"):
            self.gate.wait()
        super().write_bytes(relpath, data)


def test_a_store_slower_than_training_makes_it_wait_instead_of_piling_up_steps(tmp_path):
    # finished steps waiting to be published counted nothing: with a slow store the outbox grew by a
    # step's objects (~1.5 KB) at every step, however small the bound
    store = SlowStore(str(tmp_path / "run"))
    writer = RunWriter(store, "worker_0", max_queue_bytes=BOUND)
    done: list = []

    def run():
        one = np.ones(1, dtype=np.float32)
        for step in range(2000):
            writer.write_tensor(step, ModeKeys.TRAIN, step, "w", one)
            writer.end_step(step)
            done.append(step)

    trainer = threading.Thread(target=run, daemon=True)
    trainer.start()
    try:
        trainer.join(2.0)
        assert trainer.is_alive(), "training should wait: the steps held pass the bound"
        assert len(done) < 2 * BOUND // 512  # what the queue and the outbox hold: ~140 steps
    finally:
        store.gate.set()
    trainer.join(60)
    assert not trainer.is_alive() and len(done) == 2000
    assert writer.close() == {}
    assert len(list((tmp_path / "run" / "index").rglob("*.json"))) == 2000


def grown(tmp_path, writer: str, steps: int, per_step: int, names: str) -> dict:
    """How many KiB the training process and the writer process grew while a run saved these scalars."""
    out = subprocess.run(
        [sys.executable, str(HERE / "many_names_run.py"), str(tmp_path / "run"), writer]
        + [str(steps), str(per_step), names],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["child"] == (writer == "process"), result
    return result


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_many_distinct_names_stay_within_the_bound(tmp_path, writer):
    # 40,000 distinct names with a 1 MiB bound: the writer's cache of event headers kept ~500 bytes a
    # name whatever the bound (before: the thread writer grew by ~20 MiB here, the writer process as
    # much); now it holds a share of the bound (measured: < 1 MiB of growth)
    result = grown(tmp_path, writer, 400, 100, "distinct")
    assert result["training_kib"] < 8 * 1024, result
    assert result["child_kib"] < 8 * 1024, result


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_long_run_keeps_the_writer_near_the_bound(tmp_path, writer):
    # 50,000 steps of one scalar with a 1 MiB bound. Publishing a step (a rename and a write) can be
    # slower than encoding it: the outbox of finished steps grew as far as the publisher fell behind
    # (~1.8 KB a waiting step; 11,000 waiting, +12-23 MiB, in either writer on a busy machine). Now
    # measured: +3 MiB. The training process keeps ~40 bytes a written step.
    result = grown(tmp_path, writer, 50_000, 1, "same")
    assert result["child_kib"] < 6 * 1024, result
    assert result["training_kib"] < 6 * 1024, result


def test_the_reduction_name_table_starts_over_on_both_sides_within_its_budget():
    # the writer process keeps a copy of every list of reduction names it was sent: past its share of
    # the bound both sides forget them, and the lists that follow are sent again whole
    table, child, got = Names(4096), {}, []

    class Collect:
        def write_scalars(self, step, mode, mode_step, names, values, wall_time):
            got.append((names, values[0].tolist()))

    for step in range(40):
        names = [[f"tensor_{step}_{i}/{r}" for r in ("mean", "max")] for i in range(5)]
        values = [np.array([step, i], dtype=np.float32) for i in range(5)]
        header, buffers = encode([("scalars", step, ModeKeys.TRAIN, step, names, values, 0.0)], table)
        give(Collect(), header, bytearray(b"".join(bytes(b) for b in buffers)), child, None)
        assert got[-1] == (names, [step, 0]) and table.held <= 4096
        assert sum(table._bytes(some) for some in child.values()) <= 4096


MIB = 1024 * 1024


def bounded_s3_run(s3_uri, tmp_path, steps: int, *, outage=None) -> dict:
    """bound_run.py saving `steps` steps of a 4 MiB tensor to S3 with a 16 MiB bound; ``outage``: the
    server, stopped for the training and started again before the hook closes."""
    cmd = [sys.executable, str(HERE / "bound_run.py"), s3_uri, str(steps), "4", str(16 * MIB)]
    go = tmp_path / "go"
    if outage is not None:
        cmd += ["--go", str(go)]
        outage.stop()
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        if outage is not None:
            assert proc.stdout.readline().strip() == "trained", proc.stderr.read()[-2000:]
            outage.start()
            go.touch()
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_the_bound_holds_what_waits_for_s3_and_what_is_being_uploaded(s3_uri, tmp_path):
    # To S3, a finished step waited in memory for its upload (up to min(bound, 64 MiB) more), the step
    # being encoded was staged in memory (up to 8 MiB more) and the upload held the file twice (ours and
    # the client's copy), none of it counted: 4 MiB steps with a 16 MiB bound allocated ~34 MiB. Now
    # every one of those bytes counts in the bound (measured: ~13 MiB).
    result = bounded_s3_run(s3_uri, tmp_path, 16)
    assert result["peak"] <= 16 * MIB, result
    trial = create_trial(s3_uri)
    assert trial.steps() == list(range(17)) and trial.training_ended()
    assert trial.tensor("big").value(16).nbytes == 4 * MIB


def test_an_s3_outage_keeps_the_bound_and_training_going(s3_server, s3_uri, tmp_path):
    # the server is down while the run trains: its steps wait on local disk (only their objects in
    # memory), training goes on, and they land once the server is back, before close returns
    result = bounded_s3_run(s3_uri, tmp_path, 12, outage=s3_server)
    assert result["peak"] <= 16 * MIB, result
    trial = create_trial(s3_uri)
    assert trial.steps() == list(range(13)) and trial.training_ended() and not trial.unsaved_steps
    np.testing.assert_array_equal(trial.tensor("big").value(12), np.arange(MIB, dtype=np.float32))
