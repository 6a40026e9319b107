"""A real XGBoost script that never imports smdebug produces a run when a hook configuration is present
(the core's activation on import calls the plugin's smdebug_activate)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import smdebug.xgboost as smd

SCRIPT = """
import json, sys
import numpy as np
import xgboost as xgb

rng = np.random.default_rng(0)
X = rng.normal(size=(200, 4))
y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(float)
dtrain = xgb.DMatrix(X, label=y)
history = {}
xgb.train({"max_depth": 2, "objective": "binary:logistic", "nthread": 1}, dtrain, 4,
          evals=[(dtrain, "train")], evals_result=history, verbose_eval=False)
model = xgb.XGBRegressor(n_estimators=2, max_depth=2, n_jobs=1)
model.fit(X, X[:, 0], eval_set=[(X, X[:, 0])], verbose=False)
json.dump({"train": history["train"], "sklearn": model.evals_result()["validation_0"]}, open(sys.argv[1], "w"))
assert "smdebug_xgb" in sys.modules, "the plugin was not activated"
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def check_run(out_dir: str, reported: Path) -> None:
    history = json.loads(reported.read_text())
    trial = smd.create_trial(out_dir)
    assert trial.training_ended()  # the hook closed at exit
    # xgboost.train's four rounds, then the scikit-learn fit's two continue the steps
    assert trial.steps() == [0, 1, 2, 3, 4, 5]
    assert [trial.tensor("train-logloss").value(s)[0] for s in range(4)] == pytest.approx(
        history["train"]["logloss"]
    )
    assert [trial.tensor("validation_0-rmse").value(s)[0] for s in (4, 5)] == pytest.approx(
        history["sklearn"]["rmse"]
    )
    assert trial.tensor("feature_importance/weight/f0").value(3)[0] > 0


def test_under_a_config_file(tmp_path, script):
    out_dir = str(tmp_path / "run")
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "LocalPath": out_dir,
                "HookParameters": {"save_interval": "1"},
                "CollectionConfigurations": [
                    {"CollectionName": "metrics"},
                    {"CollectionName": "feature_importance"},
                ],
            }
        )
    )
    env = {"PATH": "/usr/bin:/bin", "SMDEBUG_CONFIG_FILE_PATH": str(config)}
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "history.json")], check=True, env=env, timeout=120
    )
    check_run(out_dir, tmp_path / "history.json")


def test_under_smdebug_run(tmp_path, script):
    out_dir = str(tmp_path / "run")
    smdebug = str(Path(sys.executable).parent / "smdebug")
    command = [smdebug, "run", "--out-dir", out_dir, "--collections", "metrics,feature_importance"]
    command += ["--save-interval", "1", "--", "python", str(script), str(tmp_path / "history.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"run saved to {out_dir}" in done.stdout
    check_run(out_dir, tmp_path / "history.json")


DASK_SCRIPT = """
import json, sys
import dask.array as da
import numpy as np
import xgboost as xgb
from distributed import Client, LocalCluster
from xgboost import dask as dxgb

if __name__ == "__main__":
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 4))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(float)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        dtrain = dxgb.DaskDMatrix(client, da.from_array(X, chunks=(200, 4)), da.from_array(y, chunks=200))
        params = {"max_depth": 2, "objective": "binary:logistic", "nthread": 1}
        result = dxgb.train(client, params, dtrain, 3, evals=[(dtrain, "train")])
        json.dump(result["history"]["train"], open(sys.argv[1], "w"))
"""


def test_an_xgboost_dask_script_under_smdebug_run(tmp_path):
    """Activation wraps xgboost.dask.train as it wraps xgboost.train: every worker saves its rounds."""
    script = tmp_path / "train_dask.py"
    script.write_text(DASK_SCRIPT)
    out_dir = str(tmp_path / "run")
    smdebug = str(Path(sys.executable).parent / "smdebug")
    command = [smdebug, "run", "--out-dir", out_dir, "--collections", "metrics", "--save-interval", "1"]
    command += ["--", "python", str(script), str(tmp_path / "history.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"run saved to {out_dir}" in done.stdout, done.stdout + done.stderr
    history = json.loads((tmp_path / "history.json").read_text())
    trial = smd.create_trial(out_dir)
    assert trial.training_ended() and trial.steps() == [0, 1, 2]
    assert [trial.tensor("train-logloss").value(s)[0] for s in range(3)] == pytest.approx(history["logloss"])
