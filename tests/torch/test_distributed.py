"""Two real processes (gloo backend) writing to one out_dir, as torchrun would start them."""

import json
import os

import numpy as np
import pytest
from support import run_ranks

import smdebug.pytorch as smd

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")


def run_two_ranks(out_dir, include_workers):
    run_ranks(WORKER, out_dir, include_workers)
    expected = []
    for rank in range(2):
        with open(f"{out_dir}.expected_{rank}.json") as f:
            expected.append(json.load(f))
    return expected


def worker_files(out_dir):
    return sorted(name for _, _, files in os.walk(out_dir) for name in files if "worker_" in name)


@pytest.mark.timeout(300)
def test_include_workers_all_saves_every_rank_with_its_own_values(out_dir):
    expected = run_two_ranks(out_dir, "all")
    assert [e["worker"] for e in expected] == ["worker_0", "worker_1"]
    assert [e["num_workers"] for e in expected] == [2, 2]
    trial = smd.create_trial(out_dir)
    assert trial.workers() == ["worker_0", "worker_1"]
    assert trial.steps() == [0, 1, 2]
    assert any(name.startswith("worker_1") for name in worker_files(out_dir))
    for rank, exp in enumerate(expected):
        worker = f"worker_{rank}"
        for step, rec in enumerate(exp["steps"]):
            np.testing.assert_allclose(
                trial.tensor("MLP_input_0").value(step, worker=worker), rec["x"], rtol=1e-6
            )
            assert trial.tensor("CrossEntropyLoss_output_0").value(step, worker=worker) == pytest.approx(
                rec["loss"]
            )
            np.testing.assert_allclose(
                trial.tensor("MLP_fc1.weight").value(step, worker=worker), rec["weight"], rtol=1e-6
            )
            # like smdebug, the gradient saved is this rank's own, before DDP averages it across ranks,
            # and its own pass's (steps 0 and 1 accumulate)
            np.testing.assert_allclose(
                trial.tensor("gradient/MLP_fc2.bias").value(step, worker=worker), rec["local_grad"], rtol=1e-5
            )
    # the ranks really saw different data
    x0 = trial.tensor("MLP_input_0").value(0, worker="worker_0")
    assert not np.allclose(x0, trial.tensor("MLP_input_0").value(0, worker="worker_1"))


@pytest.mark.timeout(300)
def test_include_workers_one_saves_only_rank_zero(out_dir):
    expected = run_two_ranks(out_dir, "one")
    trial = smd.create_trial(out_dir)
    assert trial.workers() == ["worker_0"]
    assert trial.steps() == [0, 1, 2]
    files = worker_files(out_dir)
    assert files and all("worker_0" in name for name in files)
    assert trial.tensor("CrossEntropyLoss_output_0").value(1) == pytest.approx(
        expected[0]["steps"][1]["loss"]
    )


def test_a_stop_signal_stops_every_rank_after_the_same_step(out_dir):
    """Each rank looks for the signal at its own moment: one that stopped alone left the other waiting in
    the next all-reduce (until the process group's timeout, 30 minutes by default)."""
    outputs = run_ranks(os.path.join(os.path.dirname(__file__), "stop_worker.py"), out_dir)
    stopped = [out.strip().splitlines()[-1] for out in outputs]
    assert stopped[0].startswith("stopped after step ") and stopped[0] == stopped[1], outputs
