"""Fixtures every test session shares (each suite's conftest adds its own)."""

import json
import logging
import os

import pytest

from smdebug import plugins

# Sized for 2 cores: one compute thread per process (torch reads this when imported, after this file),
# training subprocesses included.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch):
    """Each test sees the entry points as they are now (some tests disable plugins through the env)."""
    monkeypatch.delenv("SMDEBUG_DISABLE_PLUGINS", raising=False)
    plugins.reset()
    yield
    plugins.reset()


@pytest.fixture
def out_dir(tmp_path):
    return str(tmp_path / "run")


@pytest.fixture
def caplog_smdebug(caplog):
    caplog.set_level(logging.INFO, logger="smdebug")
    return caplog


# -- resume after preemption (smdebug.checkpoint_state), shared by each framework's test ---------------
class Preemption:
    """A training script run as a job that is preempted after a checkpoint, then restarted with the same
    checkpoint configuration (SageMaker's managed spot training).

    The script takes ``OUT_DIR RUN STEPS CHECKPOINT_AT KILL_AT``: it goes on from the checkpoint in
    ``CKPT_DIR`` (environment) when there is one, trains up to step STEPS - 1 saving the scalar "run" = RUN
    at every step, writes its checkpoint (the framework's own save) after step CHECKPOINT_AT, and after
    step KILL_AT flushes the hook and kills itself (SIGKILL: no close, no exit handlers)."""

    def __init__(self, folder, out_dir):
        self.folder = folder
        self.out_dir = out_dir

    def run(self, script, run, steps, checkpoint_at=-1, kill_at=-1, python=None, out_dir=None):
        """Run the job in a process of its own (``python``: another interpreter, e.g. smdebug 1.0.34's)."""
        import signal
        import subprocess
        import sys

        env = {**os.environ, "CKPT_DIR": str(self.folder)}
        args = [python or sys.executable, str(script), out_dir or self.out_dir]
        args += map(str, (run, steps, checkpoint_at, kill_at))
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        expected = -signal.SIGKILL if kill_at >= 0 else 0
        assert done.returncode == expected, done.stderr[-3000:]
        return done

    def check(self, runs: dict[int, int], mode=None, seen: int | None = None):
        """The run reads as one history: exactly the steps of ``runs`` (step -> the run that saved it last),
        each once, with the run's own values, and mode steps numbered on; the state recorded in the
        checkpoint folder has smdebug 1.0's keys."""
        from smdebug.modes import ModeKeys
        from smdebug.trials import create_trial

        mode = ModeKeys.TRAIN if mode is None else mode
        trial = create_trial(self.out_dir)
        assert trial.steps() == sorted(runs)
        assert trial.steps(mode=mode) == sorted(runs)
        assert [trial.mode_step(s) for s in runs] == list(runs)
        assert {s: int(trial.tensor("scalar/run").value(s).item()) for s in runs} == runs
        assert trial.loaded_all_steps  # the restarted job ended the run
        states = json.loads((self.folder / "metadata.json").read_text())
        assert set(states[0]) >= {
            "training-run",
            "latest-global-step-saved",
            "latest-global-step-seen",
            "latest-mode-step",
        }
        assert states[0]["training-run"] == 0
        if seen is not None:
            assert states[0]["latest-global-step-seen"] == seen
            assert states[0]["latest-mode-step"][mode.name] == seen
        return trial


@pytest.fixture
def preemption(tmp_path, monkeypatch):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    config = tmp_path / "checkpointconfig.json"
    config.write_text(json.dumps({"LocalPath": str(folder)}))
    monkeypatch.setenv("CHECKPOINT_CONFIG_FILE_PATH", str(config))
    return Preemption(folder, str(tmp_path / "run"))
