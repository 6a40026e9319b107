"""MirroredStrategy on two logical CPU devices (a subprocess: devices are fixed when TensorFlow starts)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tfmodels import reference_gradients

from smdebug.trials import create_trial

HERE = Path(__file__).parent


# (not under XLA: TensorFlow cannot compile a step whose variables live on two devices, with or without
# the hook: "Trying to access resource ... located in device CPU:1 from device CPU:0")
def _train(tmp_path, include_workers):
    out = str(tmp_path / "run")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(HERE)}
    args = [sys.executable, str(HERE / "mirrored_train.py"), out, include_workers]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "2"  # two replicas
    return out


def test_mirrored_strategy_saves_the_first_replica(tmp_path, data):
    x, y = data
    out = _train(tmp_path, "one")
    trial = create_trial(out)
    assert trial.workers() == ["worker_0"]  # include_workers "one": one process, the first replica's values
    assert trial.steps() == [0, 1]
    # each replica gets half of a global batch of 16: the first replica's share is the batch's first half
    np.testing.assert_array_equal(trial.tensor("labels").value(1), y[16:24])
    assert trial.tensor("hidden/outputs").value(1).shape == (8, 5)
    weights = np.load(out + ".weights.npz")
    start = [
        weights[f"1:{p}"]
        for p in ("mlp/hidden/kernel", "mlp/hidden/bias", "mlp/head/kernel", "mlp/head/bias")
    ]
    expected, _ = reference_gradients(start, x[16:24], y[16:24])
    for path, grad in expected.items():
        # Keras divides each replica's loss by the number of replicas (their sum is what is applied)
        saved = trial.tensor(f"gradients/{path}Grad").value(1)
        np.testing.assert_allclose(saved * 2, grad, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(trial.tensor("mlp/head/kernel").value(1), start[2])


def test_mirrored_strategy_all_workers(tmp_path, data):
    """include_workers="all": each replica is a worker named after its device, as smdebug 1.0 names it
    (its file names hold _job-localhost_replica-0_task-0_device-CPU-0; the Trial gives the device back)."""
    x, y = data
    out = _train(tmp_path, "all")
    trial = create_trial(out)
    devices = ["/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"]
    assert trial.workers() == devices
    assert trial.tensor("labels").workers(1) == devices
    labels = trial.tensor("labels")
    np.testing.assert_array_equal(labels.value(1, worker=devices[0]), y[16:24])
    np.testing.assert_array_equal(labels.value(1, worker=devices[1]), y[24:32])
    # the form file names hold is that worker too (as this reader named it before)
    in_files = "_job-localhost_replica-0_task-0_device-CPU-1"
    np.testing.assert_array_equal(labels.value(1, worker=in_files), y[24:32])
    python = os.environ.get("SMDEBUG_1034_PYTHON")
    if python:  # smdebug 1.0.34 names the run's workers alike (run by nox -s tests-tf)
        code = "import json, sys\nfrom smdebug.trials import create_trial\nt = create_trial(sys.argv[1])\n"
        code += "print(json.dumps([t.workers(), sorted(t.tensor('labels').workers(1))]))"
        done = subprocess.run([python, "-c", code, out], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        theirs = json.loads(done.stdout.strip().splitlines()[-1])
        assert theirs == [devices, devices]
    weights = np.load(out + ".weights.npz")
    start = [
        weights[f"1:{p}"]
        for p in ("mlp/hidden/kernel", "mlp/hidden/bias", "mlp/head/kernel", "mlp/head/bias")
    ]
    expected, _ = reference_gradients(start, x[24:32], y[24:32])
    saved = trial.tensor("gradients/mlp/head/kernelGrad").value(1, worker=devices[1])
    np.testing.assert_allclose(saved * 2, expected["mlp/head/kernel"], rtol=1e-4, atol=1e-6)
    # both replicas hold the same weights
    for device in devices:
        np.testing.assert_array_equal(trial.tensor("mlp/head/kernel").value(1, worker=device), start[2])


def _script(name: str, tmp_path) -> str:
    """Run a script of this folder (its runs go to the folder it is given, returned)."""
    out = str(tmp_path / "runs")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = [sys.executable, str(HERE / name), out]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_health_finds_a_fault_in_one_replica_at_its_step(tmp_path):
    out = _script("mirrored_health.py", tmp_path)
    second = "/job:localhost/replica:0/task:0/device:CPU:1"
    # include_workers "one": the process is worker_0, whichever replica's share held the NaN
    # "all": each replica a worker; the NaN was in the second one's share only
    for workers, worker in (("one", "worker_0"), ("all", second)):
        first = create_trial(os.path.join(out, workers)).first_nonfinite()
        assert (first["step"], first["direction"], first["tensor"], first["worker"]) == (
            3,
            "input",
            "model_input",
            worker,
        )
        # the triggering step's input saved is the share that held the NaN (not the first replica's)
        value = create_trial(os.path.join(out, workers)).tensor("model_input").value(3, worker=worker)
        assert value.shape == (4, 4) and np.isnan(value).sum() == 1
    trial = create_trial(os.path.join(out, "all"))
    with open(os.path.join(out, "all.losses.json")) as f:
        batch_losses = json.load(f)
    for step in (1, 2):  # each replica's row holds its share's loss: their mean is the batch's
        shares = [trial.tensor("loss").reduction_value(step, "l2", worker=w) for w in trial.workers()]
        assert np.mean(shares) == pytest.approx(batch_losses[step], rel=1e-5)
    for step in range(3):  # each replica's recorder, before the fault
        assert np.isfinite(trial.tensor("mlp/hidden/kernel").reduction_value(step, "l2", worker=second))


def test_a_wrapped_tape_under_a_strategy_is_one_step_a_batch(tmp_path):
    """strategy.run runs the tape's step once per replica: each batch is one step, the first replica's."""
    out = _script("mirrored_tape.py", tmp_path)
    for way in ("eager", "traced"):
        trial = create_trial(os.path.join(out, way))
        expected = np.load(os.path.join(out, way + ".npz"))
        assert trial.steps() == [0, 1, 2, 3] and trial.workers() == ["worker_0"], way
        for step in range(4):
            np.testing.assert_array_equal(
                trial.tensor("mlp/head/kernel").value(step), expected["kernels"][step]
            )
            assert float(trial.tensor("loss").value(step)) == pytest.approx(float(expected["losses"][step]))
