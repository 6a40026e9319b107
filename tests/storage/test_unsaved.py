"""Runs that lost steps say so: the writer records them in the run (unsaved_steps/<worker>.json, before the
end-of-job marker), Trial.unsaved_steps and `smdebug ls` show them. Steps are lost here for real: the
training process runs under a file-size limit (RLIMIT_FSIZE), so writing a large step fails as on a full disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from smdebug.cli import main as cli_main
from smdebug.trials import create_trial

SCRIPT = """
import resource, signal, sys
import numpy as np
import smdebug
from smdebug.hook import BaseHook

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
hook = BaseHook(out_dir=sys.argv[1], save_config=smdebug.SaveConfig(save_interval=1))
for step in range(8):
    hook.begin_step()
    big = step in (3, 4, 6)  # these steps' event files would pass the limit
    hook.save_tensor("w", np.full((40000,) if big else (16,), step, dtype=np.float32))
hook.close()
"""


def lose_steps(out_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, out_dir], capture_output=True, text=True, timeout=120
    )


def test_lost_steps_are_recorded_in_the_run(tmp_path, capsys):
    out_dir = str(tmp_path / "run")
    done = lose_steps(out_dir)
    assert done.returncode == 0, done.stderr
    assert "3 step(s) could not be saved: 3, 4, 6 (" in done.stderr
    trial = create_trial(out_dir)
    assert trial.training_ended()
    assert trial.steps() == [0, 1, 2, 5, 7]
    assert trial.unsaved_steps == [3, 4, 6]
    assert list(trial.unsaved()) == ["worker_0"]
    assert "File too large" in trial.unsaved()["worker_0"][4]
    record = json.loads((tmp_path / "run" / "unsaved_steps" / "worker_0.json").read_text())
    assert [e["step"] for e in record["unsaved_steps"]] == [3, 4, 6]

    assert cli_main(["ls", out_dir]) == 0
    text = capsys.readouterr().out
    assert "training ended, 3 step(s) NOT SAVED" in text
    assert "Unsaved steps (worker_0): 3-4, 6 (" in text
    assert cli_main(["ls", "--json", out_dir]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert sorted(listing["unsaved_steps"]["worker_0"]) == ["3", "4", "6"]


def test_a_complete_run_has_no_unsaved_steps(tmp_path, capsys):
    from smdebug.hook import BaseHook

    out_dir = str(tmp_path / "run")
    hook = BaseHook(out_dir=out_dir)
    hook.begin_step()
    hook.save_scalar("loss", 1.0)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.unsaved_steps == [] and trial.unsaved() == {}
    assert not (tmp_path / "run" / "unsaved_steps").exists()
    cli_main(["ls", out_dir])
    out = capsys.readouterr().out
    assert "NOT SAVED" not in out and "Unsaved" not in out


FILLS_AT_CLOSE = """
import resource, signal, sys
import numpy as np
import smdebug
from smdebug.hook import BaseHook

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
hook = BaseHook(out_dir=sys.argv[1], save_config=smdebug.SaveConfig(save_interval=1))
for step in range(12):
    hook.begin_step()
    if step < 2:
        hook.save_tensor("w", np.full(16, step, dtype=np.float32))
    else:  # past the limit by the last 6 KB, still in the file's buffer when the step's file is closed
        hook.save_tensor("a", np.full(15000, step, dtype=np.float32))
        hook.save_tensor("c", np.full(1500, step, dtype=np.float32))
hook.close()
"""


def test_a_step_that_fails_only_when_its_file_is_closed_is_recorded_and_said_once(tmp_path):
    """A full disk may fail a step's last buffered bytes only as its event file is closed: those steps
    were lost without a record (the run read as complete), their temp files left behind, and the log
    said 'writer error' once a step. Now they are recorded, and a run of steps failing alike is said once."""
    out_dir = tmp_path / "run"
    for writer_process in ("0", "1"):
        shutil.rmtree(out_dir, ignore_errors=True)
        done = subprocess.run(
            [sys.executable, "-c", FILLS_AT_CLOSE, str(out_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "SMDEBUG_WRITER_PROCESS": writer_process},
        )
        assert done.returncode == 0, done.stderr
        assert "writer error" not in done.stderr
        warnings = [line for line in done.stderr.splitlines() if "could not save step" in line]
        assert len(warnings) == 1 and "could not save step 2 " in warnings[0], done.stderr
        assert "10 step(s) could not be saved: 2, 3, 4" in done.stderr
        trial = create_trial(str(out_dir))
        assert trial.steps() == [0, 1]
        assert trial.unsaved_steps == list(range(2, 12))
        assert not [p for p in out_dir.rglob("*") if ".tmp-" in p.name]
