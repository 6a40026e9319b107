"""Helpers the test suites share (tests/ is on pytest's pythonpath: pyproject.toml)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest


def smdebug_cli(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    """Run the installed ``smdebug`` console script in a real subprocess."""
    exe = shutil.which("smdebug", path=os.path.dirname(sys.executable)) or "smdebug"
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [exe, *map(str, args)], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=300
    )


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """The command failed with exit code 2 and one line on stderr holding every fragment; that line."""
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def assert_no_rule_fires(run: str) -> str:
    """Every built-in rule (``smdebug rules RUN``) over a healthy run: none fires, none errs; the table."""
    result = smdebug_cli("rules", run, env={"COLUMNS": "200"})
    table = result.stdout
    assert "FIRED" not in table and result.returncode == 0, table + result.stderr
    return table


# numpy's own answer for each reduction smdebug computes (the reference its reductions are checked against)
NUMPY_REDUCTIONS = {
    "min": np.min,
    "max": np.max,
    "median": np.median,
    "mean": np.mean,
    "std": np.std,
    "variance": np.var,
    "sum": np.sum,
    "prod": np.prod,
    "l1": lambda a: np.sum(np.abs(a)),
    "l2": lambda a: np.sqrt(np.sum(a * a)),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(*args: str, ranks: int = 2, timeout: float = 240) -> list[str]:
    """``python *args`` as ``ranks`` processes of one job on 127.0.0.1 (torchrun's environment); each must
    succeed. Their outputs, by rank."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(ranks))
    procs = [
        subprocess.Popen(
            [sys.executable, *args],
            env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(ranks)
    ]
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank} failed:\n{out}"
    return outputs


# headless Chromium, for the HTML report's tests (Debian's chromium; nox installs it where it can)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=5000",
    "--window-size=1280,2000",
]


def chromium(page, tmp_path, *mode):
    """Run headless Chromium on a local page with a fresh profile; (stdout, stderr)."""
    exe = shutil.which("chromium")
    if exe is None:
        pytest.skip(
            "chromium is not installed (tests-analysis and tests-torch install it with apt-get where they can)"
        )
    profile = tmp_path / f"profile-{time.monotonic_ns()}"
    result = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *mode, f"file://{page}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    return result.stdout, result.stderr


def script_errors(stderr):
    return [line for line in stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]


def png_size(path):
    """(width, height) of a PNG file; fails unless the file is a PNG."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def first_loss_spike(trial) -> int:
    """The step of the first loss-spike trigger in the run's one health record (asserted to be there)."""
    (record,) = trial.health_records()
    spikes = [t for t in record["triggers"] if t["reason"].startswith("loss spike")]
    assert spikes, record
    return spikes[0]["step"]
