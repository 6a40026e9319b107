"""A local run's writer in a process of its own: the same run as the thread writer's, and nothing lost or
stalled when that process cannot start, dies mid-run, or when training dies under it."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import smdebug
from smdebug.hook import BaseHook
from smdebug.layout import index_file_path
from smdebug.modes import ModeKeys
from smdebug.trials import create_trial
from smdebug.writing import ProcessWriter, RunWriter, process_writer, wire

STEPS = 12


def train(out_dir: str, steps: int = STEPS, between=None, text: bool = True, **options) -> BaseHook:
    """Steps of raw tensors, reductions, and (unless not ``text``) text and a scalar; ``between(hook, step)``
    runs after each."""
    hook = BaseHook(out_dir=out_dir, save_config=smdebug.SaveConfig(save_interval=1), **options)
    hook.get_collection("stats").include("^stat")
    hook.get_collection("stats").reduction_config = smdebug.ReductionConfig(
        reductions=["mean", "max"], norms=["l2"], save_raw_tensor=True
    )
    hook.include_collections.append("stats")
    for step in range(steps):
        hook.begin_step()
        buffer = np.arange(12, dtype=np.float32).reshape(3, 4) * step
        hook.save_tensor("w", buffer)
        hook.save_tensor("w_t", buffer.T)  # a strided view
        hook.save_tensor("empty", np.zeros((0, 3), dtype=np.float32))
        buffer[:] = -1  # training goes on: what was saved is the value it had
        hook.save_tensor("stat", np.linspace(-1, 1, 50) * step, "stats")
        if text:
            hook.save_tensor("names", np.array(["a", "bé", b"raw"], dtype=object))
            hook.save_scalar("loss", 1.0 / (step + 1))
        hook.end_step()
        if between is not None:
            between(hook, step)
    hook.close()
    return hook


def read(out_dir: str) -> dict:
    trial = create_trial(out_dir)
    values = {}
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        for step in tensor.steps():
            values[name, step] = tensor.value(step).tolist()
            for (reduction, absolute), value in tensor.reduction_values(step).items():
                values[name, step, reduction, absolute] = float(value)
    return {"steps": trial.steps(), "ended": trial.training_ended(), "values": values}


def wait_for_the_child(hook, step, at=5):
    """At step ``at``, wait until the writer process is ready (the next step hands over to it)."""
    if step == at:
        deadline = time.monotonic() + 60
        while not hook._writer._ready and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hook._writer._ready


def test_a_local_run_is_written_by_a_process_of_its_own_and_reads_as_the_thread_writers(
    tmp_path, monkeypatch
):
    hook = train(str(tmp_path / "process"), between=wait_for_the_child)
    writer = hook._writer
    assert isinstance(writer, ProcessWriter) and writer._local is None  # the child wrote the end
    assert writer._proc.pid != os.getpid() and writer._proc.poll() == 0
    assert writer.written_steps == list(range(STEPS)) and writer.failed_steps == {}
    monkeypatch.setenv("SMDEBUG_WRITER_PROCESS", "0")
    thread_hook = train(str(tmp_path / "threads"))
    assert isinstance(thread_hook._writer, RunWriter)
    process_run, thread_run = read(str(tmp_path / "process")), read(str(tmp_path / "threads"))
    assert process_run["steps"] == list(range(STEPS)) and process_run["ended"]
    assert process_run == thread_run
    assert process_run["values"]["names", 3] == ["a", "bé", "raw"]


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="the shared memory is Linux's memfd")
def test_a_step_of_arrays_and_reductions_goes_with_a_binary_header_and_reads_the_same(tmp_path, monkeypatch):
    """A training step's usual items (arrays copied into the ring, the last step's reductions, its end)
    go with the compact header; the run is the thread writer's."""
    compact_steps = []

    def counted(self, items):
        got = compact(self, items)
        if got is not None:
            compact_steps.append(items[-1][1])
        return got

    compact = wire.Compact.__call__
    monkeypatch.setattr(wire.Compact, "__call__", counted)
    hook = train(str(tmp_path / "process"), between=wait_for_the_child, text=False)
    assert hook._writer._local is None and hook._writer.written_steps == list(range(STEPS))
    assert compact_steps == list(range(compact_steps[0], STEPS)) and compact_steps[0] <= 8
    monkeypatch.setenv("SMDEBUG_WRITER_PROCESS", "0")
    train(str(tmp_path / "threads"), text=False)
    process_run = read(str(tmp_path / "process"))
    assert process_run["steps"] == list(range(STEPS))
    assert process_run == read(str(tmp_path / "threads"))


def test_the_binary_header_reads_as_the_json_header_of_the_same_items():
    names = [["mean", "max"], ["l2"]]
    table = wire.Names(4096)
    matrix = np.arange(6, dtype=np.float32).reshape(2, 3)
    wire.encode([("scalars", 0, ModeKeys.TRAIN, 0, names, matrix, 1.0)], table)  # the child knows the lists
    in_ring = wire.InRing(128, np.dtype("<f8"), (2, 0, 3), 0)
    strided = np.arange(12, dtype=np.int64).reshape(3, 4).T
    items = [
        ("tensor", 7, ModeKeys.EVAL, 3, "ring\udc80é", in_ring, 2.5),
        ("tensor", 7, ModeKeys.EVAL, 3, "zero_d", np.array(1.5, dtype=np.float16), 2.75),
        ("tensor", 7, ModeKeys.EVAL, 3, "strided", strided, 3.0),
        ("scalars", 7, ModeKeys.EVAL, 3, names, matrix * 2, 3.25),
        ("end", 7),
    ]
    compact = wire.Compact(table)
    header, json_buffers = wire.encode(items, table)
    for step in (7, 8):  # the header made, then the same items' header with their numbers written in
        items = [(*item[:1], step, *item[2:]) for item in items]
        header = json.loads(json.dumps(wire.encode(items, table)[0]))
        head, buffers, nbytes, steps = compact(items)
        assert [bytes(b) for b in buffers] == [bytes(b) for b in json_buffers]
        assert nbytes == sum(b.nbytes for b in buffers) and steps == {step}
        for shared in ([64, nbytes], None):
            sent = b"".join(
                bytes(memoryview(p).cast("B")) for p in compact.message(head, buffers, nbytes, shared, 999)
            )
            head_len, size = wire.FRAME.unpack_from(sent)
            assert size == (0 if shared else nbytes) and len(sent) == wire.FRAME.size + head_len + size
            expanded = wire.expand(sent[wire.FRAME.size : wire.FRAME.size + head_len])
            assert expanded == json.loads(json.dumps(["items", header, shared, 999]))
    # a step whose names, dtypes or shapes differ has a header of its own
    other = [(*items[1][:4], "one_d", np.array([1.5], dtype=np.float16), 4.0), ("end", 8)]
    head, _, _, _ = compact(other)
    assert wire.expand(bytes(head[wire.FRAME.size :]))[1] == json.loads(
        json.dumps(wire.encode(other, table)[0])
    )
    # anything else takes the JSON header: text, a new list of names, a file
    text = ("tensor", 7, ModeKeys.EVAL, 3, "text", np.array(["a"], dtype=object), 1.0)
    assert compact([text, ("end", 7)]) is None
    assert compact([("scalars", 8, ModeKeys.TRAIN, 8, [["min"]], matrix, 1.0)]) is None
    assert compact([("file", "collections/x.json", b"{}")]) is None


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling policies")
def test_the_writer_process_and_its_threads_are_scheduled_as_a_batch_process(tmp_path):
    """Each step's message wakes the child: as a batch process it does not preempt the training thread."""
    policies = []

    def look(hook, step):
        wait_for_the_child(hook, step)
        if step == 8:  # the child writes steps: its encoder and publisher threads exist
            assert hook.wait_for_writer(60)
            pid = hook._writer._proc.pid
            policies.extend(os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task"))

    hook = train(str(tmp_path / "run"), between=look)
    assert hook._writer.written_steps == list(range(STEPS))
    assert len(policies) >= 3 and set(policies) == {os.SCHED_BATCH}
    assert os.sched_getscheduler(0) != os.SCHED_BATCH  # training keeps its own


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="the shared memory is Linux's memfd")
@pytest.mark.parametrize("ring_bytes", [64 + 100, 64 + 2048, process_writer.RING_BYTES])
def test_the_arrays_bytes_reach_the_writer_process_through_shared_memory_or_the_pipe(
    tmp_path, monkeypatch, ring_bytes
):
    """An array too large for the ring goes down the pipe; a small ring goes round many times; the run
    is the thread writer's either way."""
    monkeypatch.setattr(process_writer, "RING_BYTES", ring_bytes)
    steps = 40
    rings = []

    def keep_the_ring(hook, step):
        wait_for_the_child(hook, step)
        # the child drains each step before the next one, so a step's arrays never find the ring full and
        # take the pipe because the machine is slow (the wrap count would depend on the load)
        assert hook.wait_for_writer(60)
        rings.append(hook._writer._ring)

    hook = train(str(tmp_path / "process"), steps=steps, between=keep_the_ring)
    ring = rings[-1]
    assert hook._writer._local is None and ring is not None
    assert hook._writer._ring is None  # closed: this process no longer maps it
    if ring_bytes == 64 + 100:  # "w" (48 bytes) fits, "stat" (400) never does
        assert 0 < ring.used < steps * 400
    else:  # the small ring goes round more than twice
        assert ring.used > (2 * ring.size if ring_bytes == 64 + 2048 else 0)
    monkeypatch.setenv("SMDEBUG_WRITER_PROCESS", "0")
    train(str(tmp_path / "threads"), steps=steps)
    process_run = read(str(tmp_path / "process"))
    assert process_run["steps"] == list(range(steps))
    assert process_run == read(str(tmp_path / "threads"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_copy_of_training_writes_nothing(tmp_path):
    """A data loader's worker is a fork of the training process: what its copy of the hook saves is
    dropped, and it writes nothing into the memory shared with the writer process, nor into the pipe."""

    def fork_at_8(hook, step):
        wait_for_the_child(hook, step)
        if step != 8:
            return
        pid = os.fork()
        if pid == 0:  # the fork: exit code 0 when nothing reached the writer process
            ring = hook._writer._ring
            used = ring.used if ring is not None else None
            hook.begin_step()
            hook.save_tensor("w", np.full((3, 4), -7.0, dtype=np.float32))
            hook.end_step()
            hook.close()
            os._exit(0 if ring is None or ring.used == used else 1)
        assert os.waitpid(pid, 0)[1] == 0

    train(str(tmp_path / "run"), between=fork_at_8)
    run = read(str(tmp_path / "run"))
    assert run["steps"] == list(range(STEPS))
    assert all(-7.0 not in np.ravel(run["values"]["w", step]) for step in range(STEPS))


def test_the_first_steps_index_comes_after_the_runs_collections_file(tmp_path, monkeypatch):
    """A live reader counts the run's workers from its collections files: one that found a worker's first
    step before them took the run for a one-worker run, and the step for complete."""
    from smdebug.store import Store

    written = []
    write_bytes = Store.write_bytes

    def noted(store, relpath, data):
        written.append(relpath)
        return write_bytes(store, relpath, data)

    monkeypatch.setattr(Store, "write_bytes", noted)
    train(str(tmp_path / "run"), steps=2)
    collections = written.index("collections/000000000/worker_0_collections.json")
    assert collections < written.index("index/000000000/000000000000_worker_0.json")


def test_a_short_run_never_starts_a_writer_process(tmp_path):
    hook = train(str(tmp_path / "run"), steps=3)
    assert hook._writer._proc is None
    assert read(str(tmp_path / "run"))["steps"] == [0, 1, 2]


def test_a_step_written_before_the_writer_process_took_over_keeps_its_tensors_when_more_come(tmp_path):
    """A health recorder's rows (or a late save) for a step this process's writer wrote before the child
    took over: the child adds them to the step's files, it does not write the step anew."""
    out_dir = str(tmp_path / "run")

    def late(hook, step):
        wait_for_the_child(hook, step)
        if step == 7:
            assert hook._writer._local is None  # the child writes; step 2 was written here
            hook._writer.write_tensor(2, ModeKeys.GLOBAL, 2, "late", np.ones(3, np.float32))
            hook._writer.end_step(2)

    train(out_dir, between=late)
    trial = create_trial(out_dir)
    assert {"w", "stat", "names", "scalar/loss", "late"} <= set(trial.tensor_names(step=2))
    np.testing.assert_array_equal(trial.tensor("w").value(2), np.arange(12).reshape(3, 4) * 2)
    np.testing.assert_array_equal(trial.tensor("late").value(2), np.ones(3))


@pytest.mark.parametrize("flush_first", [True, False])
def test_the_writer_process_killed_mid_run_loses_no_step_silently(tmp_path, caplog, flush_first):
    out_dir = str(tmp_path / "run")

    def kill_at_8(hook, step):
        wait_for_the_child(hook, step)
        if step == 8:
            assert hook._writer._local is None  # the child writes
            if flush_first:
                hook.flush()  # steps 0-8 are written
            os.kill(hook._writer._proc.pid, signal.SIGKILL)
            hook._writer._proc.wait()

    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook = train(out_dir, between=kill_at_8)
    assert [r for r in caplog.records if "writer process" in r.getMessage()]
    assert hook._writer._local is not None  # this process wrote the rest
    trial = create_trial(out_dir)
    assert trial.training_ended()
    lost = sorted(hook._writer.failed_steps)
    assert set(trial.steps()) | set(lost) == set(range(STEPS)) and not set(trial.steps()) & set(lost)
    assert list(range(6)) == trial.steps()[:6] and set(lost) <= set(range(6, 9))
    assert lost == [] if flush_first else True
    assert trial.unsaved_steps == lost
    for step in trial.steps():  # every saved step whole
        assert {"w", "stat", "names", "scalar/loss"} <= set(trial.tensor_names(step=step))
        np.testing.assert_array_equal(trial.tensor("w").value(step), np.arange(12).reshape(3, 4) * step)


@pytest.mark.parametrize("python", ["/nonexistent/python", "/bin/false"])
def test_a_writer_process_that_cannot_start_leaves_the_writing_to_this_process(tmp_path, monkeypatch, python):
    monkeypatch.setattr(sys, "executable", python)
    out_dir = str(tmp_path / "run")
    hook = train(out_dir, between=lambda hook, step: time.sleep(0.05))
    assert hook._writer._local is not None and hook._writer._gone
    run = read(out_dir)
    assert run["steps"] == list(range(STEPS)) and run["ended"]
    assert hook._writer.failed_steps == {}


SCRIPT = """
import sys, time
import numpy as np
import smdebug
from smdebug.hook import BaseHook

hook = BaseHook(out_dir=sys.argv[1], save_config=smdebug.SaveConfig(save_interval=1))
for step in range(10**6):
    hook.begin_step()
    hook.save_tensor("w", np.full((1000,), step, dtype=np.float32))
    hook.end_step()
    print(step, hook._writer._local is None, flush=True)
    time.sleep(0.01)
"""


def test_training_killed_leaves_the_child_to_publish_its_finished_steps(tmp_path):
    out_dir = str(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, out_dir], stdout=subprocess.PIPE, text=True)
    handed_over = None
    while True:
        step, child_writes = proc.stdout.readline().split()
        if child_writes == "True" and handed_over is None:
            handed_over = int(step)
        if handed_over is not None and int(step) >= handed_over + 20:
            break
    proc.kill()
    proc.wait(30)
    last = int(step)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the child writes what it was given, then exits
        steps = create_trial(out_dir).steps()
        if steps and steps[-1] >= last:
            break
        time.sleep(0.05)
    trial = create_trial(out_dir)
    steps = trial.steps()
    assert steps[: last + 1] == list(range(last + 1))  # every step training finished, no hole
    assert not trial.training_ended()  # training did not finish
    for step in steps:
        np.testing.assert_array_equal(trial.tensor("w").value(step), np.full((1000,), step, np.float32))
    assert not Path(out_dir, "training_job_end.ts").exists()


KILLED_AFTER_FAST_STEPS = """
import os, signal, sys, time
import numpy as np
import smdebug
from smdebug.hook import BaseHook
from smdebug.writing import process_writer

process_writer.DEFER_SECONDS = 60  # finished steps wait in the shared box: nothing announces them
hook = BaseHook(out_dir=sys.argv[1], save_config=smdebug.SaveConfig(save_interval=1))
step = 0
while True:
    hook.begin_step()
    hook.save_tensor("w", np.full((3,), step, dtype=np.float32))
    hook.save_scalar("loss", float(step))
    hook.end_step()
    if hook._writer._local is None and len(hook._writer._deferred) == 3:
        print(step, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # three finished steps were never announced to the child
    step += 1
    time.sleep(0.01)
"""


def test_steps_waiting_to_be_announced_to_the_writer_process_are_written_when_training_is_killed(tmp_path):
    """Finished steps wait a little in memory shared with the child to go to it together: they are the
    child's as soon as they are finished, whatever happens to training."""
    out_dir = str(tmp_path / "run")
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_FAST_STEPS, out_dir], timeout=120, stdout=subprocess.PIPE
    )
    assert proc.returncode == -signal.SIGKILL
    last = int(proc.stdout)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the child writes what it has, then exits
        trial = create_trial(out_dir)
        if trial.steps()[-1:] == [last]:
            break
        time.sleep(0.05)
    steps = trial.steps()
    assert steps == list(range(last + 1))
    assert not trial.training_ended()
    for step in steps:
        np.testing.assert_array_equal(trial.tensor("w").value(step), np.full((3,), step))
        assert trial.tensor("scalar/loss").value(step) == step


def test_a_finished_step_reaches_a_live_reader_while_training_pauses(tmp_path):
    """A step deferred to go to the writer process with the next ones is sent anyway when no next one
    comes (an evaluation without the hook, a pause before closing)."""
    out_dir = str(tmp_path / "run")

    def pause_after_the_last(hook, step):
        wait_for_the_child(hook, step)
        if step == STEPS - 1:
            assert hook._writer._local is None
            last = Path(out_dir, index_file_path(step, hook.worker_name()))  # (not a Trial: it flushes)
            deadline = time.monotonic() + 30
            while not last.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert last.exists()  # before close

    train(out_dir, between=pause_after_the_last)
    assert read(out_dir)["ended"]


def test_a_run_several_workers_write_ends_when_the_last_of_them_does(tmp_path):
    """A live reader takes the end-of-job marker for the end of every worker's steps: the first worker to
    end wrote it, and a reader then judged the others' last steps without them."""

    class Worker(BaseHook):
        def worker_name(self):
            return type(self).name

        def num_workers(self):
            return 2

    out_dir = str(tmp_path / "run")
    hooks = []
    for name in ("worker_0", "worker_1"):
        cls = type(name, (Worker,), {"name": name})
        hook = cls(out_dir=out_dir, save_config=smdebug.SaveConfig(save_interval=1), include_workers="all")
        hook.begin_step()
        hook.save_tensor("w", np.ones(3))
        hook.flush()  # (a worker that writes the run has its collections file from its first step on)
        hooks.append(hook)
    hooks[0].close()
    assert not create_trial(out_dir).training_ended()
    hooks[1].close()
    trial = create_trial(out_dir)
    assert trial.training_ended() and trial.workers() == ["worker_0", "worker_1"]
    assert not (tmp_path / "run" / "ended").exists()  # (a finished run holds smdebug 1.0's files only)
