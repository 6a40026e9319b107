"""Both directions against the real smdebug 1.0.34: the same script runs under it and under this plugin, and
each library reads both runs. Names, steps, modes and values must agree (differences are listed below).

Runs where SMDEBUG_1034_MXNET_PYTHON names the python of a venv holding smdebug 1.0.34 and MXNet 1.9.1;
``nox -s tests-mxnet`` builds that venv (.nox/smdebug-1.0.34-mxnet) and always sets it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
REFERENCE = os.environ.get("SMDEBUG_1034_MXNET_PYTHON")
pytestmark = pytest.mark.skipif(
    not REFERENCE, reason="SMDEBUG_1034_MXNET_PYTHON is not set (nox -s tests-mxnet sets it)"
)
PARAMS = ["dense0_bias", "dense0_weight", "dense1_bias", "dense1_weight"]


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SMDEBUG", "USE_SMDEBUG"))}
    env["PYTHONWARNINGS"] = "ignore"
    return env


def _check(python, *args):
    done = subprocess.run([python, *map(str, args)], capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """scenario -> {"theirs": run dir, "ours": run dir}, each trained once."""
    root = tmp_path_factory.mktemp("compat")
    cache: dict[str, dict[str, Path]] = {}

    def get(scenario):
        if scenario not in cache:
            cache[scenario] = {}
            for who, python in (("theirs", REFERENCE), ("ours", sys.executable)):
                out = root / f"{scenario}-{who}"
                _check(python, HERE / "compat_script.py", out, scenario)
                cache[scenario][who] = out
        return cache[scenario]

    return get


def read(python, *runs):
    """What ``python``'s smdebug reads in each run (one process for all of them)."""
    found = json.loads(_check(python, HERE / "compat_reader.py", *runs).strip().splitlines()[-1])
    return found if len(runs) > 1 else found[0]


def _values_close(a, b, where, rtol=1e-6):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=1e-7, err_msg=f"{where} {key}")
    else:
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=rtol, atol=1e-7, err_msg=where)


def assert_same(expected, got, rtol=1e-6):
    assert got["steps"] == expected["steps"]
    assert sorted(got["tensors"]) == sorted(expected["tensors"])
    for name, want in expected["tensors"].items():
        have = got["tensors"][name]
        for key in ("steps", "TRAIN", "EVAL"):
            assert have[key] == want[key], f"{name} {key}"
        for step, value in want["values"].items():
            _values_close(value, have["values"][step], f"{name} step {step}", rtol)


@pytest.mark.parametrize("scenario", ["train", "reductions", "all"])
def test_identical_runs_read_by_both(runs, scenario):
    run = runs(scenario)
    theirs, ours_by_them = read(REFERENCE, run["theirs"], run["ours"])
    theirs_by_us, ours = read(sys.executable, run["theirs"], run["ours"])
    assert theirs["tensors"], "smdebug 1.0.34 saved nothing"
    assert_same(theirs, theirs_by_us)  # we read its run
    assert_same(theirs, ours_by_them)  # it reads ours
    assert_same(theirs, ours)
    for name in ("weights", "biases", "gradients", "losses", "first_layer"):
        assert ours["collections"].get(name) == theirs["collections"].get(name), name
    if scenario == "train":
        assert set(ours["tensors"]) == {
            *PARAMS, *(f"gradient/{p}" for p in PARAMS), "softmaxcrossentropyloss0_output_0",
            "dense0_input_0", "dense0_output_0", "dense1_output_0", "scalar/mean_loss", "scalar/learning_rate", "before_training",
            "batch_loss",
        }  # fmt: skip


def test_hybridized_layers_match_smdebug_1034_without_hybridize(runs):
    """1.0.34 loses the layers inside a hybridized block; ours saves what 1.0.34 saves unhybridized."""
    hybrid = runs("all-hybrid")
    plain_theirs, hybrid_theirs, hybrid_ours = read(REFERENCE, runs("all")["theirs"], *hybrid.values())
    assert_same(plain_theirs, hybrid_ours, rtol=1e-5)
    lost = set(plain_theirs["tensors"]) - set(hybrid_theirs["tensors"])
    assert {"dense0_output_0", "dense0_relu_output_0", "dense1_input_0"} <= lost
    assert set(hybrid_theirs["tensors"]) < set(hybrid_ours["tensors"])


def test_mode_changes_as_smdebug_1034(runs):
    """TRAIN 0-2, EVAL 0-1, TRAIN 3-4, EVAL 2 (global steps 0-7). smdebug 1.0.34 reads a step's parameters
    when the next step starts, under the mode current then: the same parameters and gradients are missing
    (global steps 2 and 6) or filed under an EVAL step (the gradients at global step 4) in both runs."""
    run = runs("modes")
    theirs, ours_by_them = read(REFERENCE, run["theirs"], run["ours"])
    theirs_by_us, ours = read(sys.executable, run["theirs"], run["ours"])
    for got in (ours_by_them, theirs_by_us, ours):
        assert_same(theirs, got)
    assert theirs["steps"] == list(range(8))
    assert theirs["tensors"]["dense0_weight"]["steps"] == [0, 1, 3, 4, 5, 6, 7]
    assert theirs["tensors"]["gradient/dense0_weight"]["steps"] == [0, 1, 4, 5]
