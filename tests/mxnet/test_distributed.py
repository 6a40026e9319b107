"""A real 2-worker dist_sync job on this machine (a scheduler, a server and two workers, started the way
MXNet's launcher starts them): workers are named by their kvstore rank, include_workers picks who writes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smdebug.trials import create_trial

WORKER = Path(__file__).parent / "dist_worker.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _job(out_dir, include_workers):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SMDEBUG", "USE_SMDEBUG", "DMLC_"))}
    env.update(
        DMLC_PS_ROOT_URI="127.0.0.1",
        DMLC_PS_ROOT_PORT=str(_free_port()),
        DMLC_NUM_SERVER="1",
        DMLC_NUM_WORKER="2",
        PYTHONWARNINGS="ignore",
    )
    idle = [sys.executable, "-c", "import mxnet"]  # a scheduler or server runs inside `import mxnet`
    started = [
        subprocess.Popen(
            idle, env={**env, "DMLC_ROLE": role}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for role in ("scheduler", "server")
    ]
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(out_dir), include_workers],
            env={**env, "DMLC_ROLE": "worker"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    started += workers
    try:
        results = []
        for proc in workers:
            stdout, stderr = proc.communicate(timeout=180)
            assert proc.returncode == 0, stderr[-3000:]
            results.append(json.loads(stdout.strip().splitlines()[-1]))
        return sorted(results, key=lambda r: r["rank"])
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.parametrize("include_workers", ["all", "one"])
def test_dist_sync_workers(tmp_path, include_workers):
    out = tmp_path / "run"
    results = _job(out, include_workers)
    assert [r["rank"] for r in results] == [0, 1]
    np.testing.assert_allclose(results[0]["weight"], results[1]["weight"], rtol=1e-6)  # synchronised

    trial = create_trial(str(out))
    expected = ["worker_0", "worker_1"] if include_workers == "all" else ["worker_0"]
    assert trial.workers() == expected
    assert trial.steps() == [0, 1, 2]
    assert trial.num_workers == len(expected)
    weight = trial.tensor("dense1_weight")
    for worker in expected:  # every worker saves the synchronised weights of the last step
        np.testing.assert_allclose(weight.value(2, worker=worker), results[0]["weight"], rtol=1e-6)
    if include_workers == "all":
        losses = trial.tensor("softmaxcrossentropyloss0_output_0")
        assert not np.allclose(losses.value(0, worker="worker_0"), losses.value(0, worker="worker_1"))
