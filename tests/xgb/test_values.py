"""What the hook saves equals what xgboost itself reports, round by round."""

import json
import logging
import os

import numpy as np
import pandas as pd
import pytest
import xgboost as xgb
from conftest import ALL_XGB, make_data

import smdebug.xgboost as smd
from smdebug.exceptions import ConfigError
from smdebug_xgb.collection import TREE_COLUMNS

PARAMS = {
    "max_depth": 3,
    "eta": 0.3,
    "objective": "binary:logistic",
    "eval_metric": ["logloss", "auc"],
    "nthread": 1,
}
ROUNDS = 6


def train(hook, dtrain, dvalid, params=PARAMS, rounds=ROUNDS, **kwargs):
    history = {}
    booster = xgb.train(
        params,
        dtrain,
        rounds,
        evals=[(dtrain, "train"), (dvalid, "validation")],
        evals_result=history,
        verbose_eval=False,
        callbacks=[hook],
        **kwargs,
    )
    return booster, history


def as_strings(column):
    return ["nan" if (v is None or (isinstance(v, float) and np.isnan(v))) else str(v) for v in column]


def test_every_collection_equals_what_xgboost_reports(out_dir, binary):
    dtrain, dvalid, _, _, _, y_valid = binary
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=2),
        include_collections=ALL_XGB,
        train_data=dtrain,
        validation_data=dvalid,
    )
    booster, history = train(hook, dtrain, dvalid)
    trial = smd.create_trial(out_dir)  # readable as soon as training returns
    assert trial.steps() == [0, 2, 4]
    assert trial.workers() == ["worker_0"]
    features = ["f0", "f1", "f2", "f3", "f4"]
    trees = booster.trees_to_dataframe()

    for step in trial.steps():
        upto = booster[: step + 1]  # the model as it was after this round
        # metrics: every eval set and metric, as evals_result records them
        for data in ("train", "validation"):
            for metric in ("logloss", "auc"):
                value = trial.tensor(f"{data}-{metric}").value(step)
                assert value.shape == (1,)
                assert value[0] == pytest.approx(history[data][metric][step], rel=1e-12)
        # hyperparameters: the parameters the training was given
        assert trial.tensor("hyperparameters/max_depth").value(step).tolist() == [3]
        assert trial.tensor("hyperparameters/eta").value(step).tolist() == [0.3]
        assert trial.tensor("hyperparameters/objective").value(step).tolist() == ["binary:logistic"]
        assert trial.tensor("hyperparameters/eval_metric").value(step).tolist() == ["logloss", "auc"]
        # predictions and labels on the validation set
        np.testing.assert_allclose(trial.tensor("predictions").value(step), upto.predict(dvalid), rtol=1e-6)
        np.testing.assert_array_equal(trial.tensor("labels").value(step), y_valid.astype(np.float32))
        # feature importance: every type, normalised to sum to 1
        for kind in ("weight", "gain", "cover", "total_gain", "total_cover"):
            scores = upto.get_score(importance_type=kind)
            total = sum(scores.values())
            saved = {
                n.rsplit("/", 1)[1]
                for n in trial.tensor_names(step=step, regex=f"^feature_importance/{kind}/")
            }
            assert saved == set(scores)
            for feature, score in scores.items():
                value = trial.tensor(f"feature_importance/{kind}/{feature}").value(step)
                assert value.shape == (1,) and value[0] == pytest.approx(score / total, rel=1e-9)
        # SHAP: the full contribution matrix under every feature's name, the magnitudes summed
        contributions = upto.predict(dtrain, pred_contribs=True)
        assert contributions.shape == (120, 6)
        for i, feature in enumerate(features):
            np.testing.assert_allclose(
                trial.tensor(f"full_shap/{feature}").value(step), contributions, rtol=1e-6
            )
            average = trial.tensor(f"average_shap/{feature}").value(step)
            assert average.shape == (1,)
            assert average[0] == pytest.approx(np.abs(contributions[:, i]).sum(), rel=1e-5)
        # trees: the trees_to_dataframe columns of the tree this round added
        rows = trees[trees.Tree == step]
        for column in ("Tree", "Node"):
            assert trial.tensor(f"trees/{column}").value(step).tolist() == rows[column].tolist()
        for column in ("ID", "Feature", "Yes", "No", "Missing", "Category"):
            assert trial.tensor(f"trees/{column}").value(step).tolist() == as_strings(rows[column]), column
        for column in ("Split", "Gain", "Cover"):
            np.testing.assert_allclose(trial.tensor(f"trees/{column}").value(step), rows[column], rtol=1e-7)

    # the SHAP bias column is not part of the shap collections (smdebug 1.0)
    assert not trial.has_tensor("full_shap/bias") and not trial.has_tensor("average_shap/bias")
    collections = trial.collections()
    for name in ALL_XGB:
        assert trial.tensor_names(collection=name), name
    assert "validation-logloss" in collections["metrics"].tensor_names
    assert "trees/Feature" in collections["trees"].tensor_names
    hook.close()
    assert smd.create_trial(out_dir).training_ended()


def test_default_hook_saves_metrics_every_ten_rounds(out_dir, binary):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(out_dir)
    booster, history = train(hook, dtrain, dvalid, rounds=12)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 10]
    assert set(trial.tensor_names()) == {"train-logloss", "train-auc", "validation-logloss", "validation-auc"}
    assert trial.tensor("validation-auc").value(10)[0] == pytest.approx(history["validation"]["auc"][10])


def test_metrics_can_be_turned_off_and_losses_skip_increasing_metrics(out_dir, binary):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    hook.get_collection("metrics").save_config.end_step = 0
    train(hook, dtrain, dvalid, rounds=3)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert set(trial.tensor_names()) == {"train-logloss", "validation-logloss"}  # no auc among losses
    assert trial.steps() == [0, 1, 2]


@pytest.mark.parametrize(
    "objective, metrics, losses",
    [
        ("rank:ndcg", ["ndcg-", "map@3-", "rmse"], {"train-rmse"}),  # "-": empty query lists score 0
        ("survival:aft", ["interval-regression-accuracy", "aft-nloglik"], {"train-aft-nloglik"}),
    ],
)
def test_losses_skip_every_metric_that_grows(out_dir, objective, metrics, losses):
    X, y = make_data(task="regression")
    dtrain = xgb.DMatrix(X, label=y)
    if objective == "rank:ndcg":
        dtrain.set_label((y > 0).astype(float))
        dtrain.set_group([40] * 4)
    else:  # survival times in intervals [lower, upper]
        dtrain.set_float_info("label_lower_bound", np.exp(y))
        dtrain.set_float_info("label_upper_bound", np.exp(y) * 1.5)
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    params = {"objective": objective, "eval_metric": metrics, "max_depth": 2, "nthread": 1}
    xgb.train(params, dtrain, 2, evals=[(dtrain, "train")], callbacks=[hook], verbose_eval=False)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert len(trial.tensor_names(collection="metrics")) == len(metrics)
    assert set(trial.tensor_names(collection="losses")) == losses


def test_save_all_and_include_regex(tmp_path, binary):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(str(tmp_path / "all"), save_config=smd.SaveConfig(save_steps=[1]), save_all=True)
    train(hook, dtrain, dvalid, rounds=3)
    hook.close()
    names = smd.create_trial(str(tmp_path / "all")).tensor_names()
    # everything the hook can compute without data: metrics, hyperparameters, importances, trees
    assert {"validation-auc", "hyperparameters/eta", "feature_importance/gain/f0", "trees/Node"} <= set(names)

    hook = smd.Hook(
        str(tmp_path / "regex"),
        save_config=smd.SaveConfig(save_interval=1),
        include_regex=["feature_importance/weight/.*"],
    )
    train(hook, dtrain, dvalid, rounds=2)
    hook.close()
    names = smd.create_trial(str(tmp_path / "regex")).tensor_names()
    assert {n for n in names if not n.startswith("feature_importance/weight/")} == {
        "train-logloss",
        "train-auc",
        "validation-logloss",
        "validation-auc",
    }
    assert "feature_importance/weight/f0" in names


def test_hyperparameters_given_to_the_hook_win(out_dir, binary):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(
        out_dir,
        include_collections=["hyperparameters"],
        hyperparameters={"num_round": 3, "objective": "binary:logistic"},
    )
    train(hook, dtrain, dvalid, rounds=1)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert set(trial.tensor_names(collection="hyperparameters")) == {
        "hyperparameters/num_round",
        "hyperparameters/objective",
    }
    assert trial.tensor("hyperparameters/num_round").value(0).tolist() == [3]


def test_multiclass_trees_and_shap_per_round(out_dir):
    X, y = make_data(task="multiclass")
    dtrain = xgb.DMatrix(X, label=y, feature_names=["a", "b", "c", "d", "e"])
    params = {"objective": "multi:softprob", "num_class": 3, "max_depth": 2, "nthread": 1}
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["trees", "average_shap", "full_shap", "feature_importance"],
        train_data=dtrain,
    )
    booster = xgb.train(params, dtrain, 3, callbacks=[hook])
    trial = smd.create_trial(out_dir)
    trees = booster.trees_to_dataframe()
    for step in range(3):
        # three trees (one per class) a round
        expected = trees[trees.Tree.isin([3 * step, 3 * step + 1, 3 * step + 2])]
        assert trial.tensor("trees/ID").value(step).tolist() == expected.ID.tolist()
        contributions = booster[: step + 1].predict(dtrain, pred_contribs=True)
        assert contributions.shape == (160, 3, 6)
        np.testing.assert_allclose(trial.tensor("full_shap/a").value(step), contributions, rtol=1e-6)
        assert trial.tensor("average_shap/b").value(step)[0] == pytest.approx(
            np.abs(contributions[:, :, 1]).sum(), rel=1e-5
        )
    assert "feature_importance/gain/a" in trial.tensor_names()


def test_categorical_splits(out_dir):
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"colour": pd.Categorical(rng.integers(0, 6, 300)), "size": rng.normal(size=300)})
    label = ((frame.colour.cat.codes % 2) + frame["size"] > 0.5).astype(float)
    dtrain = xgb.DMatrix(frame, label=label, enable_categorical=True)
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["trees"])
    booster = xgb.train({"max_depth": 3, "max_cat_to_onehot": 1, "nthread": 1}, dtrain, 2, callbacks=[hook])
    trial = smd.create_trial(out_dir)
    trees = booster.trees_to_dataframe()
    for step in range(2):
        rows = trees[trees.Tree == step]
        categories = ["nan" if not isinstance(c, list) else ",".join(c) for c in rows.Category]
        assert trial.tensor("trees/Category").value(step).tolist() == categories
        assert any(c != "nan" for c in categories)
        assert trial.tensor("trees/Feature").value(step).tolist() == rows.Feature.tolist()


@pytest.mark.parametrize("estimator", ["classifier", "regressor"])
def test_scikit_learn_estimators(out_dir, estimator):
    task = "binary" if estimator == "classifier" else "regression"
    X, y = make_data(task=task)
    cls = xgb.XGBClassifier if estimator == "classifier" else xgb.XGBRegressor
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["metrics", "hyperparameters", "feature_importance"],
    )
    model = cls(n_estimators=4, max_depth=2, n_jobs=1, callbacks=[hook])
    model.fit(X[:120], y[:120], eval_set=[(X[120:], y[120:])], verbose=False)
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3]
    metric = "logloss" if estimator == "classifier" else "rmse"
    history = model.evals_result()["validation_0"][metric]
    assert [trial.tensor(f"validation_0-{metric}").value(s)[0] for s in range(4)] == pytest.approx(history)
    assert trial.tensor("hyperparameters/max_depth").value(0).tolist() == [2]
    scores = model.get_booster().get_score(importance_type="gain")
    assert trial.tensor("feature_importance/gain/f0").value(3)[0] == pytest.approx(
        scores["f0"] / sum(scores.values()), rel=1e-9
    )
    assert smd.get_hook() is hook


def test_grid_search_in_parallel_says_its_workers_rounds_are_not_saved(out_dir, capfd):
    """GridSearchCV(n_jobs=2) pickles the hook into joblib's worker processes, each outside distributed
    training, each one worker_0: they wrote over each other's steps without a word."""
    from sklearn.model_selection import GridSearchCV

    X, y = make_data()
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1))
    estimator = xgb.XGBClassifier(n_estimators=3, n_jobs=1, callbacks=[hook])
    search = GridSearchCV(estimator, {"max_depth": [1, 2]}, cv=2, n_jobs=2)
    search.fit(X, y, eval_set=[(X, y)], verbose=False)
    hook.close()
    stderr = capfd.readouterr().err
    assert "copied into another process" in stderr and "not saved" in stderr, stderr
    # what the run holds is the refit of the best model, in this process, alone
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2] and trial.workers() == ["worker_0"]
    history = search.best_estimator_.evals_result()["validation_0"]["logloss"]
    assert [trial.tensor("validation_0-logloss").value(s)[0] for s in range(3)] == pytest.approx(history)


def test_second_training_continues_the_steps(out_dir, binary):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1))
    first, _ = train(hook, dtrain, dvalid, rounds=2)
    _, history = train(hook, dtrain, dvalid, rounds=2, xgb_model=first)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.tensor("train-logloss").value(3)[0] == pytest.approx(history["train"]["logloss"][1])


@pytest.mark.parametrize("save_best", [False, True])
@pytest.mark.parametrize("stopper_first", [True, False])
def test_the_round_early_stopping_ends_on_is_saved_whatever_the_callbacks_order(
    out_dir, binary, save_best, stopper_first
):
    # xgboost calls the callbacks' after_iteration until one returns True: an EarlyStopping listed
    # before the hook stops boosting without the hook seeing the last round
    dtrain, dvalid, _, _, _, y_valid = binary
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["metrics", "predictions", "labels", "trees", "feature_importance"],
        validation_data=dvalid,
    )
    stopper = xgb.callback.EarlyStopping(rounds=2, save_best=save_best)
    history = {}
    booster = xgb.train(
        {**PARAMS, "eta": 1.0, "max_depth": 4},
        dtrain,
        100,
        evals=[(dvalid, "validation")],
        evals_result=history,
        verbose_eval=False,
        callbacks=[stopper, hook] if stopper_first else [hook, stopper],
    )
    hook.close()
    rounds = len(history["validation"]["logloss"])
    assert rounds < 100 and booster.best_iteration < rounds - 1  # it stopped early
    trial = smd.create_trial(out_dir)
    assert trial.steps() == list(range(rounds))
    assert [trial.tensor("validation-logloss").value(s)[0] for s in range(rounds)] == pytest.approx(
        history["validation"]["logloss"]
    )
    last = rounds - 1  # saved from the model as it was after that round (not the best one save_best keeps)
    full = xgb.train(
        {**PARAMS, "eta": 1.0, "max_depth": 4},
        dtrain,
        rounds,
        evals=[(dvalid, "validation")],
        verbose_eval=False,
    )
    np.testing.assert_allclose(trial.tensor("predictions").value(last), full.predict(dvalid), rtol=1e-6)
    np.testing.assert_array_equal(trial.tensor("labels").value(last), y_valid.astype(np.float32))
    trees = full.trees_to_dataframe()
    assert trial.tensor("trees/Node").value(last).tolist() == trees[trees.Tree == last].Node.tolist()
    scores = full.get_score(importance_type="weight")
    assert trial.tensor("feature_importance/weight/f0").value(last)[0] == pytest.approx(
        scores["f0"] / sum(scores.values())
    )


def test_multi_target_trees_xgboost_cannot_dump_or_explain_are_recorded_in_one_line(out_dir, caplog_smdebug):
    X, y = make_data(task="regression")
    dtrain = xgb.DMatrix(X, label=np.column_stack([y, -y]))
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=ALL_XGB,
        train_data=dtrain,
        validation_data=dtrain,
    )
    params = {"tree_method": "hist", "multi_strategy": "multi_output_tree", "max_depth": 2, "nthread": 1}
    xgb.train(params, dtrain, 2, evals=[(dtrain, "train")], callbacks=[hook])
    hook.close()
    messages = [r.getMessage() for r in caplog_smdebug.records if r.levelno == logging.WARNING]
    assert len(messages) == 2 and not any("\n" in m or "Stack trace" in m for m in messages), messages
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1] and trial.tensor("predictions").value(1).shape == (160, 2)
    unsaved = trial.unsaved_tensors()["worker_0"]
    assert set(unsaved) == {f"trees/{c}" for c in TREE_COLUMNS} | {
        f"{kind}/f{i}" for kind in ("full_shap", "average_shap") for i in range(5)
    }
    assert "multi-target" in unsaved["trees/Node"]["reason"]


def test_training_with_a_closed_hook_says_its_rounds_are_not_saved(out_dir, binary, caplog_smdebug):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1))
    train(hook, dtrain, dvalid, rounds=2)
    hook.close()
    assert not any(r.levelno == logging.WARNING for r in caplog_smdebug.records)
    for _ in range(2):
        train(hook, dtrain, dvalid, rounds=2)
    said = [r.getMessage() for r in caplog_smdebug.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "closed" in said[0] and "not saved" in said[0], said
    assert smd.create_trial(out_dir).steps() == [0, 1]


def test_the_hooks_reduction_config_is_ignored_with_a_warning(out_dir, binary, caplog_smdebug):
    """smdebug 1.0's XGBoost page: reduction_config is "Not supported in XGBoost and will be ignored":
    tensors are saved whole, and one warning says so."""
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        reduction_config=smd.ReductionConfig(reductions=["mean", "max"]),
        include_collections=["predictions", "trees"],
        validation_data=dvalid,
    )
    booster, _ = train(hook, dtrain, dvalid, rounds=2)
    trial = smd.create_trial(out_dir)
    np.testing.assert_allclose(trial.tensor("predictions").value(1), booster.predict(dvalid), rtol=1e-6)
    assert trial.tensor("predictions").reduction_values(1) == {}
    assert trial.tensor("trees/Gain").value(1).max() > 0
    assert trial.tensor("validation-logloss").value(1).shape == (1,)
    warnings = [r.getMessage() for r in caplog_smdebug.records if r.levelno == logging.WARNING]
    assert sum("reduction_config" in m and "ignored" in m for m in warnings) == 1


def test_a_collections_own_reduction_config_applies_to_its_numeric_tensors(out_dir, binary):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["predictions", "trees"],
        validation_data=dvalid,
    )
    for name in ("predictions", "trees"):
        hook.get_collection(name).reduction_config = smd.ReductionConfig(reductions=["mean", "max"])
    booster, _ = train(hook, dtrain, dvalid, rounds=2)
    trial = smd.create_trial(out_dir)
    assert trial.tensor("predictions").reduction_value(1, "mean") == pytest.approx(
        booster.predict(dvalid).mean(), rel=1e-6
    )
    assert trial.tensor("trees/Gain").reduction_value(1, "max") > 0
    assert trial.tensor("trees/Feature").value(1).dtype.kind == "U"  # text stays whole


def test_missing_data_and_linear_booster_warn_once_and_go_on(out_dir, binary, caplog_smdebug):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=ALL_XGB)
    params = {**{k: v for k, v in PARAMS.items() if k != "max_depth"}, "booster": "gblinear"}
    train(hook, dtrain, dvalid, params=params, rounds=3)
    hook.close()
    messages = [r.getMessage() for r in caplog_smdebug.records if r.levelno == logging.WARNING]
    assert sum("validation_data" in m for m in messages) == 1
    assert sum("train_data" in m for m in messages) == 1
    assert sum("gblinear" in m for m in messages) == 2  # feature importance and trees
    trial = smd.create_trial(out_dir)
    names = trial.tensor_names()
    assert "validation-logloss" in names and "hyperparameters/booster" in names
    assert not any(n.startswith(("trees/", "feature_importance/", "predictions")) for n in names)
    # what was asked for and could not be saved is recorded in the run, with why
    unsaved = trial.unsaved_tensors()["worker_0"]
    assert "validation_data" in unsaved["predictions"]["reason"] and "labels" in unsaved
    assert "train_data" in unsaved["average_shap/f0"]["reason"] and "full_shap/f4" in unsaved


def test_data_the_booster_refuses_costs_its_tensors_only_said_in_one_line(out_dir, binary, caplog_smdebug):
    dtrain, dvalid, X, y, Xv, yv = binary
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=ALL_XGB,
        train_data=xgb.DMatrix(X[:, :3], label=y),  # two columns short
        validation_data=xgb.DMatrix(np.column_stack([Xv, Xv]), label=yv),  # five columns too many
    )
    train(hook, dtrain, dvalid, rounds=2)
    hook.close()
    messages = [r.getMessage() for r in caplog_smdebug.records if r.levelno == logging.WARNING]
    assert len(messages) == 2 and not any("\n" in m or "Stack trace" in m for m in messages), messages
    assert any("train_data has 3 columns, the booster 5 features" in m for m in messages), messages
    assert any("predict on validation_data" in m and "Number of columns" in m for m in messages), messages
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1] and trial.has_tensor("labels") and trial.has_tensor("trees/Node")
    assert not trial.tensor_names(regex="shap|predictions")
    unsaved = trial.unsaved_tensors()["worker_0"]
    assert "3 columns" in unsaved["full_shap/f0"]["reason"]
    assert "Number of columns" in unsaved["predictions"]["reason"]


def test_predictions_on_a_sparse_validation_set_narrower_than_the_training_data(out_dir, binary):
    """A libsvm validation file whose last features never appear is narrower than the training data:
    xgboost predicts on it (absent is missing), and so the hook does."""
    import scipy.sparse

    dtrain, dvalid, _, _, Xv, yv = binary
    narrow = xgb.DMatrix(scipy.sparse.csr_matrix(Xv[:, :4]), label=yv)
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["predictions"],
        validation_data=narrow,
    )
    booster, _ = train(hook, dtrain, dvalid, rounds=2)
    saved = smd.create_trial(out_dir).tensor("predictions").value(1)
    np.testing.assert_allclose(saved, booster.predict(narrow), rtol=1e-6)


def test_data_from_files(out_dir, tmp_path, binary):
    _, _, X, y, Xv, yv = binary
    with open(tmp_path / "train.libsvm", "w") as f:
        for label, row in zip(y, X):
            f.write(f"{label:g} " + " ".join(f"{j}:{float(v)!r}" for j, v in enumerate(row)) + "\n")
    np.savetxt(tmp_path / "valid.csv", np.column_stack([yv, Xv]), delimiter=";")
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["labels", "predictions", "average_shap"],
        train_data=(str(tmp_path / "train.libsvm"), "text/x-libsvm"),
        validation_data=(str(tmp_path / "valid.csv"), "text/csv"),
    )
    booster, _ = train(hook, xgb.DMatrix(X, label=y), xgb.DMatrix(Xv, label=yv), rounds=1)
    trial = smd.create_trial(out_dir)
    np.testing.assert_array_equal(trial.tensor("labels").value(0), yv.astype(np.float32))
    np.testing.assert_allclose(
        trial.tensor("predictions").value(0), booster.predict(xgb.DMatrix(Xv)), rtol=1e-6
    )
    contributions = booster.predict(xgb.DMatrix(X), pred_contribs=True)
    assert trial.tensor("average_shap/f0").value(0)[0] == pytest.approx(
        np.abs(contributions[:, 0]).sum(), rel=1e-5
    )


def test_a_ranking_libsvm_file_with_query_ids(out_dir, tmp_path):
    # "<label> qid:<query> <index>:<value> ...", as xgboost's own libsvm reader (and so smdebug 1.0) reads it
    rng = np.random.default_rng(0)
    X, qid = rng.normal(size=(60, 3)), np.repeat(np.arange(6), 10)
    y = rng.integers(0, 3, 60).astype(float)
    lines = [
        f"{label:g} qid:{q} " + " ".join(f"{j}:{float(v)!r}" for j, v in enumerate(row))
        for label, q, row in zip(y, qid, X)
    ]
    (tmp_path / "valid.libsvm").write_text("\n".join(lines) + "\n")
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["labels", "predictions"],
        validation_data=(str(tmp_path / "valid.libsvm"), "libsvm"),
    )
    np.testing.assert_array_equal(hook.validation_data.get_group(), [10] * 6)
    dtrain = xgb.DMatrix(X, label=y, qid=qid)
    booster = xgb.train({"objective": "rank:ndcg", "nthread": 1}, dtrain, 2, callbacks=[hook])
    trial = smd.create_trial(out_dir)
    np.testing.assert_array_equal(trial.tensor("labels").value(1), y.astype(np.float32))
    np.testing.assert_allclose(
        trial.tensor("predictions").value(1), booster.predict(xgb.DMatrix(X)), rtol=1e-6
    )


def test_a_csv_file_with_missing_values(out_dir, tmp_path, binary):
    # empty fields are missing values, as xgboost's own CSV reader (and so smdebug 1.0) takes them
    _, _, X, y, Xv, yv = binary
    Xv = Xv.copy()
    Xv[::3, 1] = np.nan
    Xv[1::4, 4] = np.nan
    rows = [
        ",".join("" if np.isnan(v) else repr(float(v)) for v in (label, *row)) for label, row in zip(yv, Xv)
    ]
    (tmp_path / "valid.csv").write_text("\n".join(rows) + "\n")
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["labels", "predictions"],
        validation_data=(str(tmp_path / "valid.csv"), "csv"),
    )
    booster, _ = train(hook, xgb.DMatrix(X, label=y), xgb.DMatrix(Xv, label=yv), rounds=2)
    trial = smd.create_trial(out_dir)
    np.testing.assert_array_equal(trial.tensor("labels").value(1), yv.astype(np.float32))
    np.testing.assert_allclose(
        trial.tensor("predictions").value(1), booster.predict(xgb.DMatrix(Xv)), rtol=1e-6
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"train_data": np.zeros((2, 2))}, "train_data: expected an xgboost.DMatrix"),
        ({"validation_data": ("/no/such/file.csv", "csv")}, "is not a local file"),
        ({"train_data": (__file__, "parquet")}, "content type 'parquet'"),
        ({"train_data": (__file__, "libsvm")}, "cannot read"),
        ({"hyperparameters": [("eta", 1)]}, "hyperparameters: expected a dict"),
        ({"include_workers": "some"}, "include_workers"),
    ],
)
def test_bad_arguments_fail_at_creation(out_dir, binary, kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        smd.Hook(out_dir, **kwargs)
    # the refused hook left nothing behind: the user corrects the argument and goes on in the same out_dir
    assert not os.path.exists(out_dir)
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1))
    train(hook, *binary[:2], rounds=1)
    hook.close()
    assert smd.create_trial(out_dir).steps() == [0]


def test_dry_run_writes_nothing(out_dir, binary):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(out_dir, dry_run=True, save_config=smd.SaveConfig(save_interval=1))
    train(hook, dtrain, dvalid, rounds=2)
    hook.close()
    assert not os.path.exists(out_dir)


def test_hook_from_json_config(tmp_path, binary, monkeypatch):
    dtrain, dvalid = binary[:2]
    out_dir = str(tmp_path / "run")
    config = {
        "LocalPath": out_dir,
        "HookParameters": {"save_interval": "2"},
        "CollectionConfigurations": [
            {"CollectionName": "feature_importance"},
            {"CollectionName": "metrics", "CollectionParameters": {"save_interval": "1"}},
        ],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(path))
    hook = smd.Hook.create_from_json_file()
    assert isinstance(hook, smd.Hook) and smd.get_hook() is hook
    train(hook, dtrain, dvalid, rounds=4)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor("train-auc").steps() == [0, 1, 2, 3]
    assert trial.tensor("feature_importance/weight/f0").steps() == [0, 2]
    monkeypatch.delenv("SMDEBUG_CONFIG_FILE_PATH")
    monkeypatch.setattr("smdebug.json_config.DEFAULT_CONFIG_PATH", str(tmp_path / "absent.json"))
    assert smd.Hook.create_from_json_file() is None
    assert smd.get_hook(json_config_path=str(path)) is hook
    assert smd.Hook.hook_from_config() is None


@pytest.mark.parametrize(
    "hook_parameters, collection_parameters, metrics, trees",
    [
        # as smdebug 1.0: the save keys a JSON config leaves out take XGBoost's defaults (every 10 rounds)
        ({"start_step": "3"}, None, [10, 20], [10, 20]),
        ({"end_step": "12"}, None, [0, 10], [0, 10]),
        ({"save_steps": "1,2"}, None, [0, 1, 2, 10, 20], [0, 1, 2, 10, 20]),
        ({"train.save_interval": "4"}, None, [0, 10, 20], [0, 10, 20]),  # boosting rounds are GLOBAL steps
        # a collection's own keys over the hook's, the rest XGBoost's defaults
        ({"start_step": "3"}, {"end_step": "15"}, [10, 20], [10]),
    ],
)
def test_json_config_keys_left_out_take_xgboosts_defaults(
    tmp_path, binary, hook_parameters, collection_parameters, metrics, trees
):
    dtrain = binary[0]
    out_dir = str(tmp_path / "run")
    trees_config = {"CollectionName": "trees"}
    if collection_parameters:
        trees_config["CollectionParameters"] = collection_parameters
    config = {
        "LocalPath": out_dir,
        "HookParameters": hook_parameters,
        "CollectionConfigurations": [trees_config],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    hook = smd.Hook.create_from_json_file(str(path))
    xgb.train(PARAMS, dtrain, 25, evals=[(dtrain, "train")], verbose_eval=False, callbacks=[hook])
    trial = smd.create_trial(out_dir)
    assert trial.tensor("train-logloss").steps() == metrics
    assert trial.tensor("trees/Node").steps() == trees


def test_get_hook_creates_from_json(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"LocalPath": str(tmp_path / "run")}))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(path))
    from smdebug import hook as core_hook

    monkeypatch.setattr(core_hook, "_active_hook", None)
    assert smd.get_hook() is None
    hook = smd.get_hook(create_if_not_exists=True)
    assert isinstance(hook, smd.Hook) and hook.out_dir == str(tmp_path / "run")
    assert smd.get_hook() is hook


@pytest.mark.parametrize("mode", [None, smd.modes.TRAIN])
def test_save_scalar_before_training_does_not_shift_the_rounds(out_dir, binary, mode):
    dtrain, dvalid = binary[:2]
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=2))
    hook.save_scalar("num_round", 10)  # in GLOBAL mode, at step 0
    if mode is not None:
        hook.set_mode(mode)
    _, history = train(hook, dtrain, dvalid, rounds=10)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor("scalar/num_round").value(0).item() == 10  # kept: it joined step 0
    metric = trial.tensor("train-logloss")
    assert metric.steps(mode=mode or smd.modes.GLOBAL) == [0, 2, 4, 6, 8]
    assert metric.value(8, mode=mode or smd.modes.GLOBAL)[0] == pytest.approx(history["train"]["logloss"][8])


def test_cross_validation_saves_metrics_and_hyperparameters(out_dir, binary, caplog_smdebug):
    dtrain = binary[0]
    hook = smd.Hook(
        out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["hyperparameters", "trees"]
    )
    result = xgb.cv({**PARAMS, "eval_metric": "logloss"}, dtrain, 3, nfold=3, callbacks=[hook])
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2]
    # the mean over the folds, as xgboost.cv reports it
    assert [trial.tensor("test-logloss").value(s)[0] for s in range(3)] == pytest.approx(
        result["test-logloss-mean"].tolist()
    )
    assert trial.tensor("hyperparameters/max_depth").value(0).tolist() == [3]
    assert not trial.tensor_names(regex="^trees/")
    assert any("xgboost.cv" in r.getMessage() for r in caplog_smdebug.records)
