"""close() with a writer backlog: the close timeout is honoured, and every step not written by then is
recorded in the run (unsaved_steps/<worker>.json), never lost silently."""

from __future__ import annotations

import logging
import time

import numpy as np

from smdebug.modes import ModeKeys
from smdebug.store import Store
from smdebug.trials import create_trial
from smdebug.writing import RunWriter

STEPS = 3000


class BusyDisk(Store):
    """A real local Store on a busy disk: staging each step's event file takes a millisecond."""

    def stage(self, relpath):
        time.sleep(0.001)
        return super().stage(relpath)


def test_thread_writer_close_records_its_backlog(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="smdebug")
    out = str(tmp_path / "run")
    writer = RunWriter(BusyDisk(out), "worker_0")
    for step in range(STEPS):  # far faster than the disk takes them
        writer.write_tensor(
            step, ModeKeys.TRAIN, step, "loss", np.array([step], dtype=np.float32), time.time()
        )
        writer.end_step(step)
    started = time.monotonic()
    # (2 s: close keeps a quarter of it for the record of unsaved steps, which under a load of 7 on
    # 2 cores 1 s's quarter did not always leave the publisher)
    failed = writer.close(timeout=2.0, end_of_job=True)
    took = time.monotonic() - started
    assert took < 2.0 + 0.5, took

    trial = create_trial(out)
    written, unsaved = set(trial.steps()), set(trial.unsaved_steps)
    assert failed, "the backlog was written within the timeout: no test"
    assert unsaved == set(failed), "steps lost at close are not recorded in the run"
    assert written | unsaved == set(range(STEPS)), "a step is neither written nor recorded unsaved"
    assert not written & unsaved
    assert trial.training_ended()


def test_a_writer_child_that_hangs_at_close_has_its_steps_recorded(tmp_path, caplog):
    import os
    import signal

    from smdebug.writing import ProcessWriter

    caplog.set_level(logging.INFO, logger="smdebug")
    out = str(tmp_path / "run")
    writer = ProcessWriter(Store(out), "worker_0", close_timeout=1.0, uri=out)
    value = np.ones(4, dtype=np.float32)
    step, deadline = 0, time.monotonic() + 60
    while writer._local is not None:  # steps go to the child once it is ready
        assert time.monotonic() < deadline, "the writer process never took over"
        writer.write_tensor(step, ModeKeys.TRAIN, step, "w", value * step)
        writer.end_step(step)
        step += 1
        time.sleep(0.01)
    assert writer.flush(30)
    before = step
    os.kill(writer._proc.pid, signal.SIGSTOP)  # the child hangs: it holds what it is given from now on
    try:
        for step in range(before, before + 15):
            writer.write_tensor(step, ModeKeys.TRAIN, step, "w", value * step)
            writer.end_step(step)
        failed = writer.close(end_of_job=True)
    finally:
        if writer._proc.poll() is None:
            os.kill(writer._proc.pid, signal.SIGCONT)
    held = set(range(before, before + 15))
    assert held <= set(failed)
    trial = create_trial(out)
    assert set(trial.unsaved_steps) == held and set(trial.steps()) == set(range(before))
    assert trial.training_ended()
    text = caplog.text
    assert "the hook stopped it" in text and "exited with code -9" not in text
