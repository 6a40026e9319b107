"""The real smdebug 1.0.34 (its own venv: it reads runs without TensorFlow) reads a Keras run of ours with
the same names, steps, collections and values as our reader."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tfmodels import make_model

import smdebug.tensorflow as smd

HERE = Path(__file__).parent


def _describe(python, run):
    proc = subprocess.run(
        [python, str(HERE / "describe_run.py"), run], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_smdebug_1_0_34_reads_a_keras_run_as_we_do(tmp_path, data):
    python = os.environ.get("SMDEBUG_1034_PYTHON")
    if not python or not os.path.exists(python):
        pytest.fail(
            "SMDEBUG_1034_PYTHON must name the python of a venv with smdebug 1.0.34: run `nox -s tests-tf`"
        )
    x, y = data
    out = str(tmp_path / "run")
    hook = smd.KerasHook(
        out_dir=out,
        save_config=smd.SaveConfig(save_interval=2),
        reduction_config=smd.ReductionConfig(norms=["l2"], save_raw_tensor=True),
        include_collections=["weights", "biases", "gradients", "losses", "metrics", "outputs", "layers"],
    )
    model = make_model(jit_compile=True)
    model.fit(x, y, epochs=1, batch_size=8, validation_data=(x[:8], y[:8]), callbacks=[hook], verbose=0)
    model.evaluate(x, y, batch_size=16, callbacks=[hook], verbose=0)
    model.predict(x, batch_size=16, callbacks=[hook], verbose=0)
    hook.close()
    theirs = _describe(python, out)
    ours = _describe(sys.executable, out)
    assert theirs["tensor_names"] == ours["tensor_names"]
    assert "gradients/mlp/head/kernelGrad" in theirs["tensor_names"]
    assert theirs["steps"] == ours["steps"]
    assert theirs["collections"] == ours["collections"]
    assert set(theirs["tensors"]["mlp/head/kernel"]["TRAIN/0"][3]) == {"l2"}  # the stored reduction
    assert theirs == ours
