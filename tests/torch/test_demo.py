"""The README's demo (examples/demo.py): the planted problem is caught, the healthy run is quiet."""

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import png_size

DEMO = Path(__file__).parents[2] / "examples" / "demo.py"


def _rows(stdout):
    """RULE -> RESULT of the demo's results table."""
    lines = stdout.split("Built-in rules", 1)[1].splitlines()[2:]
    rows = {}
    for line in lines:
        if not line.startswith("  "):
            break
        parts = line.split()
        rows[parts[0]] = "FIRED" if "FIRED" in line else parts[-1]
    return rows


@pytest.mark.parametrize("healthy", [False, True], ids=["planted", "healthy"])
def test_demo(tmp_path, healthy):
    out, plot = tmp_path / "run", tmp_path / "demo.png"
    args = [sys.executable, str(DEMO), "--out-dir", str(out), "--plot", str(plot)]
    result = subprocess.run(
        args + (["--healthy"] if healthy else []), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert set(rows) == {
        "vanishing_gradient",
        "loss_not_decreasing",
        "exploding_tensor",
        "weight_update_ratio",
        "all_zero",
    }
    if healthy:
        assert set(rows.values()) == {"ok"}
    else:
        assert rows["vanishing_gradient"] == rows["loss_not_decreasing"] == "FIRED"
        assert "Net_inp.weight" in result.stdout  # the first layer's gradient is the one that vanished
        assert rows["exploding_tensor"] == "ok"
    width, height = png_size(plot)
    assert width > 600 and height > 600
    assert "(10 curves)" in result.stdout  # the loss in TRAIN and EVAL, 8 weight gradients
    assert (out / "tensorboard" / "TRAIN").is_dir()


def test_closing_hints_name_commands_that_work_from_where_the_user_is(tmp_path):
    """As after `nox -s demo`: the environment's scripts are not on PATH; the hints still run as printed."""
    out = tmp_path / "run"
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    args = [
        sys.executable,
        str(DEMO),
        "--out-dir",
        str(out),
        "--plot",
        str(tmp_path / "d.png"),
        "--steps",
        "20",
    ]
    result = subprocess.run(
        args + ["--healthy"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    (more,) = [line for line in result.stdout.splitlines() if line.startswith("More: ")]
    commands = [c.strip() for c in more[len("More: ") :].split("|")]
    assert [next(w for w in c.split() if w in ("ls", "show", "rules")) for c in commands] == [
        "ls",
        "show",
        "rules",
    ]
    for command in commands:
        ran = subprocess.run(
            shlex.split(command), capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
        )
        assert ran.returncode in (0, 1), (command, ran.stderr)  # `smdebug rules` exits 1 when a rule fires
        assert "Traceback" not in ran.stderr
    (board,) = [line for line in result.stdout.splitlines() if line.startswith("TensorBoard: ")]
    hint = board.split(": ", 1)[1]
    if importlib.util.find_spec("tensorboard") is None:
        assert "pip install 'smdebug-core[tensorboard]'" in hint
    else:  # this environment's tensorboard, by a name or path that works from the demo's directory
        exe = shlex.split(hint)[0]
        assert shutil.which(exe, path=env["PATH"]) or (tmp_path / exe).is_file(), hint
