"""Helpers the test suites share (tests/ is on pytest's pythonpath: pyproject.toml)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import numpy as np


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
