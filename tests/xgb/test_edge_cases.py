"""Cases found by fuzzing: callbacks around the hook, unusual names, data and options."""

import logging
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import xgboost as xgb
from conftest import make_data

import smdebug.xgboost as smd
from smdebug.exceptions import ConfigError

PARAMS = {"objective": "binary:logistic", "max_depth": 3, "nthread": 1}


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


class StopBefore(xgb.callback.TrainingCallback):
    """Stops boosting from before_iteration: xgboost never trains that round."""

    def __init__(self, epoch):
        self.epoch = epoch

    def before_iteration(self, model, epoch, evals_log):
        return epoch == self.epoch


def test_a_round_stopped_before_training_is_no_step(out_dir, binary):
    dtrain = binary[0]
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["trees"])
    history = {}
    xgb.train(
        PARAMS,
        dtrain,
        10,
        evals=[(dtrain, "train")],
        evals_result=history,
        verbose_eval=False,
        callbacks=[hook, StopBefore(3)],
    )
    # a second training goes on at the step the untrained round had begun
    xgb.train(PARAMS, dtrain, 2, evals=[(dtrain, "train")], verbose_eval=False, callbacks=[hook])
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3, 4]
    saved = [trial.tensor("train-logloss").value(s)[0] for s in range(3)]
    assert saved == pytest.approx(history["train"]["logloss"])
    assert trial.tensor("trees/Tree").value(2).max() == 2


def test_the_last_round_after_early_stopping_is_saved_without_a_false_warning(
    out_dir, binary, caplog_smdebug
):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["predictions"],
        validation_data=dvalid,
    )
    history = {}
    booster = xgb.train(
        {**PARAMS, "eta": 1.0},
        dtrain,
        100,
        evals=[(dvalid, "validation")],
        evals_result=history,
        verbose_eval=False,
        callbacks=[xgb.callback.EarlyStopping(rounds=2), hook],  # before the hook: it stops the last round
    )
    hook.close()
    rounds = len(history["validation"]["logloss"])
    assert rounds < 100 and not warnings(caplog_smdebug)
    trial = smd.create_trial(out_dir)
    assert trial.steps() == list(range(rounds))
    np.testing.assert_allclose(trial.tensor("predictions").value(rounds - 1), booster.predict(dvalid))


def test_falling_metrics_of_an_eval_name_with_a_slash_are_losses(out_dir, binary):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    params = {**PARAMS, "eval_metric": ["logloss", "auc"]}
    xgb.train(params, dtrain, 2, evals=[(dvalid, "val/a")], verbose_eval=False, callbacks=[hook])
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names(collection="metrics") == ["val/a-auc", "val/a-logloss"]
    assert trial.tensor_names(collection="losses") == ["val/a-logloss"]


@pytest.mark.parametrize(
    "kwargs", [{"include_collections": ["average_shap", "full_shap"]}, {"save_all": True}]
)
def test_a_feature_named_bias_keeps_its_name_and_the_bias_column_is_not_saved(
    out_dir, caplog_smdebug, kwargs
):
    X, y = make_data(features=3)
    dtrain = xgb.DMatrix(X, label=y, feature_names=["bias", "b", "c"])
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), train_data=dtrain, **kwargs)
    booster = xgb.train(PARAMS, dtrain, 2, callbacks=[hook])
    hook.close()
    trial = smd.create_trial(out_dir)
    contributions = booster.predict(dtrain, pred_contribs=True)
    assert trial.tensor_names(collection="average_shap") == [
        "average_shap/b",
        "average_shap/bias",
        "average_shap/c",
    ]
    assert trial.tensor("average_shap/bias").value(1)[0] == pytest.approx(
        np.abs(contributions[:, 0]).sum(), rel=1e-5
    )
    said = [m for m in warnings(caplog_smdebug) if "'bias'" in m]
    assert len(said) == 1 and "bias column is not saved" in said[0]


def test_a_data_file_xgboost_refuses_is_said_in_one_line(tmp_path):
    path = tmp_path / "inf.csv"
    path.write_text("1,inf,2\n0,0.5,3\n")
    with pytest.raises(ConfigError) as raised:
        smd.Hook(str(tmp_path / "run"), train_data=(str(path), "csv"))
    message = str(raised.value)
    assert len(message.splitlines()) == 1 and "`inf`" in message and "Stack trace" not in message


def test_a_data_file_path_may_be_a_path_object(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("1,0.5,2\n0,0.25,3\n")
    hook = smd.Hook(str(tmp_path / "run"), train_data=(path, "csv"), validation_data=(Path(path), "csv"))
    assert hook.train_data.num_row() == 2 and hook.validation_data.num_col() == 2
    with pytest.raises(ConfigError, match=r"got \(str, int\)"):
        smd.Hook(str(tmp_path / "other"), train_data=(str(path), 1))


def test_health_is_refused_with_one_warning_and_no_health_record(out_dir, binary, caplog_smdebug):
    dtrain = binary[0]
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), health=True)
    assert hook.health is None
    xgb.train(PARAMS, dtrain, 2, evals=[(dtrain, "train")], verbose_eval=False, callbacks=[hook])
    hook.close()
    said = [m for m in warnings(caplog_smdebug) if "health" in m]
    assert len(said) == 1 and "XGBoost" in said[0]
    assert smd.create_trial(out_dir).steps() == [0, 1]
    assert not os.path.exists(os.path.join(out_dir, "health"))


def test_trees_of_indicator_features_are_saved(out_dir, caplog_smdebug):
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.integers(0, 2, 200), rng.normal(size=200)]).astype(float)
    y = ((X[:, 0] > 0) ^ (X[:, 1] > 0.5)).astype(float)
    dtrain = xgb.DMatrix(X, label=y, feature_types=["i", "q"])
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["trees"])
    booster = xgb.train(PARAMS, dtrain, 3, callbacks=[hook])
    hook.close()
    assert not warnings(caplog_smdebug)
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2]
    features = trial.tensor("trees/Feature").value(0)
    indicator = features == "f0"
    assert indicator.any()  # the tree splits on the indicator first
    assert np.isnan(trial.tensor("trees/Split").value(0)[indicator]).all()
    assert (trial.tensor("trees/Missing").value(0)[indicator] == "nan").all()
    assert len(features) == booster.get_dump()[0].count("\n")  # a row per node


def test_a_model_unpickled_in_the_hooks_process_trains_as_the_hook(out_dir, caplog_smdebug):
    X, y = make_data()
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1))
    model = xgb.XGBClassifier(n_estimators=3, n_jobs=1, callbacks=[hook])
    model.fit(X, y, eval_set=[(X, y)], verbose=False)
    again = pickle.loads(pickle.dumps(model))
    again.fit(X, y, eval_set=[(X, y)], verbose=False)
    hook.close()
    assert not warnings(caplog_smdebug)
    trial = smd.create_trial(out_dir)
    assert trial.steps() == list(range(6))
    history = again.evals_result()["validation_0"]["logloss"]
    assert [trial.tensor("validation_0-logloss").value(s)[0] for s in (3, 4, 5)] == pytest.approx(history)
