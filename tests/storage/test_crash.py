"""Crash safety: real training in a subprocess, SIGKILLed mid-run."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from conftest import start_training

from smdebug.trials import create_trial


def wait_for_saved_steps(out_dir: str, n: int, proc, timeout: float = 120.0) -> list[int]:
    deadline = time.monotonic() + timeout
    trial = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            trial = trial or create_trial(out_dir)
            trial.refresh()
            if len(trial.steps()) >= n:
                return trial.steps()
        except Exception:
            trial = None  # nothing written yet
        time.sleep(0.05)
    raise AssertionError(f"training did not save {n} steps in {timeout}s")


@pytest.mark.parametrize("where", ["local", "s3"])
def test_sigkill_mid_run_leaves_every_completed_step_readable(where, tmp_path, request, caplog):
    out_dir = str(tmp_path / "run") if where == "local" else request.getfixturevalue("s3_uri")
    proc = start_training(out_dir, 100000)  # runs until killed
    try:
        seen = wait_for_saved_steps(out_dir, 8, proc)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    trial = create_trial(out_dir)  # opens without error
    steps = trial.steps()
    assert steps[: len(seen)] == seen  # everything seen before the kill is still there
    assert steps == list(range(len(steps)))  # no hole: the step in flight is simply not there
    assert not trial.training_ended()
    names = set(trial.tensor_names())
    assert {"Sequential_0.weight", "gradient/Sequential_2.bias", "MSELoss_output_0"} <= names
    for step in steps:
        assert set(trial.tensor_names(step=step)) == names  # every step complete
        for name in names:
            assert np.all(np.isfinite(trial.tensor(name).value(step)))
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "damaged" in r.getMessage()]
