"""A new user's first hour with the XGBoost hook: no built-in rule fires on a healthy run."""

import numpy as np
import pytest
import xgboost as xgb
from conftest import ALL_XGB
from support import assert_no_rule_fires, smdebug_cli

import smdebug.xgboost as smd


def test_no_builtin_rule_fires_on_a_healthy_run(tmp_path):
    out = str(tmp_path / "run")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1200, 6))
    positive = X > 0  # every feature matters, in pairs a tree learns exactly
    y = positive[:, 0] & positive[:, 1] | positive[:, 2] & positive[:, 3] | positive[:, 4] & positive[:, 5]
    y = y.astype(float)
    dtrain, dvalid = xgb.DMatrix(X[:900], label=y[:900]), xgb.DMatrix(X[900:], label=y[900:])
    hook = smd.Hook(
        out,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=ALL_XGB,
        train_data=dtrain,
        validation_data=dvalid,
    )
    params = {"objective": "binary:logistic", "max_depth": 4, "nthread": 1, "eval_metric": "logloss"}
    xgb.train(params, dtrain, 12, evals=[(dtrain, "train"), (dvalid, "validation")], callbacks=[hook])
    hook.close()
    table = assert_no_rule_fires(out)
    assert "trees" not in table  # saved (NaN marks a leaf's missing split), and no reason to fire


def test_no_false_alarm_at_round_0_nor_from_repeated_importance_shares(tmp_path):
    """A booster whose first round's tree uses three features (top-3 share 100% by construction) and
    whose importance shares repeat between rounds: neither is a defect."""
    out = str(tmp_path / "run")
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 6))
    y = (X.sum(axis=1) + 0.3 * rng.normal(size=400) > 0).astype(float)  # every feature counts as much
    hook = smd.Hook(
        out, save_config=smd.SaveConfig(save_interval=1), include_collections=["feature_importance"]
    )
    params = {"objective": "binary:logistic", "max_depth": 2, "nthread": 1}  # round 0: 3 splits
    xgb.train(params, xgb.DMatrix(X, label=y), 8, callbacks=[hook])
    hook.close()
    result = smdebug_cli(
        "rules", out, "--rule", "feature_importance_overweight", "--rule", "weight_update_ratio"
    )
    assert result.returncode == 0 and "FIRED" not in result.stdout, result.stdout


@pytest.mark.parametrize("task", ["regression", "ranking"])
def test_no_classifier_rule_fires_on_a_healthy_regression_or_ranking(tmp_path, task):
    """Their labels and predictions are no class ids (continuous targets, relevance scores): confusion and
    class_imbalance read them as classes and fired on every step."""
    out = str(tmp_path / "run")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 4))
    if task == "regression":
        y = X @ np.array([1.0, -1.0, 0.8, -0.8]) + 0.1 * rng.normal(size=600)
        params = {"objective": "reg:squarederror", "max_depth": 3, "nthread": 1}
    else:
        y = (X.sum(axis=1) > 0).astype(float)  # relevant or not
        params = {"objective": "rank:ndcg", "max_depth": 3, "nthread": 1}
    dtrain, dvalid = xgb.DMatrix(X[:450], label=y[:450]), xgb.DMatrix(X[450:], label=y[450:])
    if task == "ranking":
        dtrain.set_group([45] * 10)
        dvalid.set_group([30] * 5)
    hook = smd.Hook(
        out,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["metrics", "predictions", "labels"],
        validation_data=dvalid,
    )
    xgb.train(params, dtrain, 6, evals=[(dtrain, "train"), (dvalid, "validation")], callbacks=[hook])
    hook.close()
    result = smdebug_cli("rules", out, "--rule", "confusion", "--rule", "class_imbalance")
    assert result.returncode == 0 and "FIRED" not in result.stdout, result.stdout
