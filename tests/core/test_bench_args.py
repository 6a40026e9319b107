"""`nox -s bench -- ARGS` as a user types them: a misspelt row or a bad round count is one line naming it
and the nearest row, before anything runs, and bench/RESULTS.md is left as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).parents[2] / "bench" / "run.py"


def bench(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(RUN), "--smdebug-python", sys.executable, "--baseline-python", sys.executable]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "overheed"], "--only: unknown row 'overheed'; did you mean 'overhead'?"),
        (["--only", "local,mxnett"], "--only: unknown row 'mxnett'; did you mean 'mxnet'?"),
        (["--only", ","], "--only: no row named"),
        (["--only", "local", "--rounds", "0"], "--rounds: 0 is not a positive number of rounds"),
    ],
)
def test_bad_arguments_are_one_line_and_write_nothing(tmp_path, args, message):
    results = tmp_path / "RESULTS.md"
    results.write_text("# earlier results\n")
    done = bench(*args, "--output", str(results))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert "[bench" not in done.stdout  # nothing was measured
    assert results.read_text() == "# earlier results\n"


def test_help_lists_the_rows_without_any_venv():
    # `nox -s bench -- --help` runs it with nox's own python, before building the bench's venvs
    done = subprocess.run(
        [sys.executable, "-S", str(RUN), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for row in ("overhead", "local", "s3", "import", "memory", "sweep", "tf", "mxnet"):
        assert row in done.stdout
