"""The plugin's hooks: framework declaration, alias import, rules, and activation in unmodified scripts."""

import copy
import json
import subprocess
import sys

import numpy as np
import pytest
import xgboost as xgb
from conftest import make_data

import smdebug.xgboost as smd
from smdebug import plugins
from smdebug_xgb import activation
from smdebug_xgb.plugin import smdebug_activate


def test_plugin_declares_the_xgboost_framework():
    fw = plugins.frameworks()["xgboost"]
    assert (fw.alias, fw.package, fw.import_names) == ("xgboost", "smdebug_xgb", ("xgboost",))
    # the CPU-only build is a distribution of another name; the version check finds either
    assert fw.installed_version()[0] in ("xgboost", "xgboost-cpu")
    assert fw.supported == ">=2.0" and fw.version_problem() is None


def test_entry_point_module_does_not_import_xgboost():
    code = (
        "import sys; from smdebug import plugins; plugins.frameworks(); plugins.rules();"
        "import smdebug_xgb.plugin; assert 'xgboost' not in sys.modules, 'xgboost imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_alias_import_is_the_plugin_package():
    import smdebug.xgboost.hook
    import smdebug_xgb
    import smdebug_xgb.hook

    assert smd is smdebug_xgb and smdebug.xgboost.hook is smdebug_xgb.hook
    for name in [
        "Hook",
        "SaveConfig",
        "SaveConfigMode",
        "ReductionConfig",
        "Collection",
        "CollectionKeys",
        "modes",
    ]:
        assert hasattr(smd, name), name
    assert (
        smd.CollectionKeys.FULL_SHAP == "full_shap" and callable(smd.create_trial) and callable(smd.get_hook)
    )
    assert isinstance(smd.Hook("/tmp/unused-smdebug-xgb", dry_run=True), xgb.callback.TrainingCallback)


def test_a_copy_of_the_hook_is_the_hook(tmp_path):
    hook = smd.Hook(str(tmp_path / "run"))
    assert copy.deepcopy(hook) is hook and copy.copy(hook) is hook  # sklearn.base.clone deep-copies


# -- activation (the core calls smdebug_activate when a script imports xgboost with a config present) --
@pytest.fixture
def config(tmp_path, monkeypatch):
    out_dir = tmp_path / "auto"
    path = tmp_path / "debughookconfig.json"
    path.write_text(
        json.dumps(
            {
                "LocalPath": str(out_dir),
                "HookParameters": {"save_interval": "1"},
                "CollectionConfigurations": [
                    {"CollectionName": "metrics"},
                    {"CollectionName": "average_shap"},
                    {"CollectionName": "labels"},
                ],
            }
        )
    )
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(path))
    yield str(out_dir)
    activation.uninstall()


def activate():
    return smdebug_activate(framework=plugins.frameworks()["xgboost"], module=xgb)


def data():
    X, y = make_data()
    return xgb.DMatrix(X[:120], label=y[:120]), xgb.DMatrix(X[120:], label=y[120:]), X, y


def test_activation_needs_a_config_and_the_xgboost_framework(monkeypatch, tmp_path):
    monkeypatch.delenv("SMDEBUG_CONFIG_FILE_PATH", raising=False)
    monkeypatch.setattr("smdebug.json_config.DEFAULT_CONFIG_PATH", str(tmp_path / "absent.json"))
    original = xgb.train
    assert activate() is None
    assert xgb.train is original
    other = plugins.Framework(alias="pytorch", package="smdebug_torch", import_names=("torch",))
    assert smdebug_activate(framework=other, module=xgb) is None


def test_activation_adds_the_hook_to_xgboost_train(config):
    first = activate()
    assert isinstance(first, smd.Hook) and first.out_dir == config
    first.close()
    # through the plugin manager, as the core calls it: a second activation replaces the first
    hook = plugins.activate(plugins.frameworks()["xgboost"], xgb)
    assert isinstance(hook, smd.Hook) and hook is not first
    assert xgb.train is xgb.training.train is xgb.sklearn.train
    assert not hasattr(xgb.train.__smdebug_original__, "__smdebug_original__")  # wrapped once

    dtrain, dvalid, X, y = data()
    history = {}
    booster = xgb.train(
        {"max_depth": 2, "nthread": 1}, dtrain, 3, evals=[(dvalid, "validation")], evals_result=history
    )
    assert hook.train_data is None  # the call's data was borrowed for the call only
    hook.close()
    trial = smd.create_trial(config)
    assert trial.steps() == [0, 1, 2]
    assert trial.tensor("validation-rmse").value(2)[0] == pytest.approx(history["validation"]["rmse"][2])
    np.testing.assert_array_equal(trial.tensor("labels").value(1), y[120:].astype(np.float32))
    contributions = booster.predict(dtrain, pred_contribs=True)
    assert trial.tensor("average_shap/f1").value(2)[0] == pytest.approx(
        np.abs(contributions[:, 1]).sum(), rel=1e-5
    )


def test_activation_reaches_cross_validation(config):
    hook = activate()
    assert xgb.cv is xgb.training.cv and hasattr(xgb.cv, "__smdebug_original__")
    dtrain = data()[0]
    results = xgb.cv({"max_depth": 2, "nthread": 1}, dtrain, 3, nfold=2, seed=0)
    hook.close()
    trial = smd.create_trial(config)
    assert trial.steps() == [0, 1, 2]
    saved = [trial.tensor("test-rmse").value(s)[0] for s in trial.steps()]
    assert saved == pytest.approx(results["test-rmse-mean"].tolist())
    activation.uninstall()
    assert not hasattr(xgb.cv, "__smdebug_original__") and not hasattr(
        xgb.training.cv, "__smdebug_original__"
    )


def test_activation_keeps_the_users_own_hook(config, tmp_path):
    auto = activate()
    dtrain, dvalid, _, _ = data()
    mine = smd.Hook(str(tmp_path / "mine"), save_config=smd.SaveConfig(save_interval=1))
    xgb.train({"nthread": 1}, dtrain, 2, evals=[(dvalid, "v")], callbacks=[mine], verbose_eval=False)
    mine.close()
    auto.close()
    assert smd.create_trial(str(tmp_path / "mine")).steps() == [0, 1]
    assert auto.step == -1  # never added beside the user's hook


@pytest.mark.parametrize("estimator", [xgb.XGBClassifier, xgb.XGBRegressor])
def test_activation_reaches_scikit_learn_fit(config, estimator):
    hook = activate()
    X, y = make_data()
    model = estimator(n_estimators=3, max_depth=2, n_jobs=1)
    model.fit(X[:120], y[:120], eval_set=[(X[120:], y[120:])], verbose=False)
    hook.close()
    trial = smd.create_trial(config)
    metric = "logloss" if estimator is xgb.XGBClassifier else "rmse"
    history = model.evals_result()["validation_0"][metric]
    assert [trial.tensor(f"validation_0-{metric}").value(s)[0] for s in range(3)] == pytest.approx(history)


def test_activation_says_when_the_only_evaluation_set_is_the_training_data(config, caplog_smdebug):
    hook = activate()
    dtrain = data()[0]
    xgb.train({"nthread": 1}, dtrain, 2, evals=[(dtrain, "train")], verbose_eval=False)
    hook.close()
    said = [r.getMessage() for r in caplog_smdebug.records if "labels not saved" in r.getMessage()]
    assert len(said) == 1 and "only evaluation set is its training data" in said[0]
    assert hook._no_validation_data.startswith("no validation_data")  # the call's reason was for it only
