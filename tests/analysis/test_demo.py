"""The README's demo (examples/demo.py): the planted problem is caught, the healthy run is quiet."""

import subprocess
import sys
from pathlib import Path

import pytest

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
def test_demo(tmp_path, png, healthy):
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
    width, height = png(plot)
    assert width > 600 and height > 600
    assert "(10 curves)" in result.stdout  # the loss in TRAIN and EVAL, 8 weight gradients
    assert (out / "tensorboard" / "TRAIN").is_dir()
