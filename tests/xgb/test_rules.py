"""XGBoost's built-in rules on real boosters: they fire on a planted defect and stay quiet otherwise."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xgboost as xgb
from support import smdebug_cli

import smdebug.xgboost as smd
from smdebug import plugins
from smdebug.exceptions import NoMoreData, RuleEvaluationConditionMet, SMDebugValueError
from smdebug.rules.rule import Rule
from smdebug.rules.rule_invoker import invoke_rule
from smdebug_xgb.rules import FeatureImportanceOverweight, TreeDepth


def run(out_dir, X, y, collections, rounds=6, **params):
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=collections)
    params = {"objective": "binary:logistic", "nthread": 1, **params}
    booster = xgb.train(params, xgb.DMatrix(X, label=y), rounds, callbacks=[hook])
    hook.close()
    return smd.create_trial(out_dir), booster


def fires(rule) -> bool:
    try:
        invoke_rule(rule, raise_eval_cond=True)
    except RuleEvaluationConditionMet:
        return True
    except NoMoreData:  # the end of the run, as smdebug 1.0 says it
        return False
    return False


@pytest.fixture
def features():
    rng = np.random.default_rng(0)
    return rng.normal(size=(600, 8)), rng


def test_rules_are_contributed_through_the_hook():
    found = plugins.rules()
    assert found["tree_depth"] is TreeDepth
    assert found["feature_importance_overweight"] is FeatureImportanceOverweight
    assert issubclass(TreeDepth, Rule) and issubclass(FeatureImportanceOverweight, Rule)


def test_a_rule_added_to_the_hook_stops_boosting(tmp_path, features):
    X, rng = features
    noise = (rng.normal(size=len(X)) > 0).astype(float)
    hook = smd.Hook(
        str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1), include_collections=["trees"]
    )
    hook.add_rule("tree_depth", depth="3")  # max_depth=6 trees on noise are deeper than 3 from round 0
    booster = xgb.train(
        {"max_depth": 6, "min_child_weight": 0, "nthread": 1},
        xgb.DMatrix(X, label=noise),
        20,
        callbacks=[hook],
    )
    hook.close()
    assert booster.num_boosted_rounds() == 1
    assert hook.should_stop() and hook.rule_results[0].step == 0


def test_tree_depth(tmp_path, features):
    X, rng = features
    noise = (rng.normal(size=len(X)) > 0).astype(float)  # nothing to learn: trees grow as deep as allowed
    healthy, booster = run(str(tmp_path / "healthy"), X, noise, ["trees"], max_depth=4, min_child_weight=0)
    # a full depth-4 tree numbers its nodes up to 30 (log2 > 4): the rule follows the real structure
    assert booster.trees_to_dataframe().Node.max() > 16
    assert not fires(TreeDepth(healthy))
    assert fires(TreeDepth(healthy, depth="3"))

    deep, _ = run(str(tmp_path / "deep"), X, noise, ["trees"], max_depth=10, min_child_weight=0)
    rule = TreeDepth(deep)
    with pytest.raises(RuleEvaluationConditionMet) as met:
        invoke_rule(rule, raise_eval_cond=True)
    assert met.value.step == 0 and "deep" in rule.reason
    assert not fires(TreeDepth(deep, depth=12))


def test_tree_depth_from_node_ids_alone(tmp_path, features):
    X, rng = features
    noise = (rng.normal(size=len(X)) > 0).astype(float)
    hook = smd.Hook(
        str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1), include_regex=["^trees/Node$"]
    )
    xgb.train(
        {"max_depth": 6, "min_child_weight": 0, "nthread": 1},
        xgb.DMatrix(X, label=noise),
        2,
        callbacks=[hook],
    )
    hook.close()
    trial = smd.create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(regex="^trees/") == ["trees/Node"]
    assert fires(TreeDepth(trial, depth=4))  # log2 of the largest node id, as documented
    assert not fires(TreeDepth(trial, depth=7))


def test_feature_importance_overweight(tmp_path, features):
    X, rng = features
    balanced = (X.sum(axis=1) + 0.5 * rng.normal(size=len(X)) > 0).astype(float)
    healthy, _ = run(str(tmp_path / "healthy"), X, balanced, ["feature_importance"], max_depth=4)
    assert not fires(FeatureImportanceOverweight(healthy))

    one_feature = (X[:, 0] > 0).astype(float)  # the planted defect: a single feature decides
    skewed, _ = run(str(tmp_path / "skewed"), X, one_feature, ["feature_importance"], max_depth=4)
    rule = FeatureImportanceOverweight(skewed, threshold="0.8", nfeatures="3")
    assert fires(rule) and "f0" in rule.reason
    # the parameters choose what is read and how much is too much
    assert fires(FeatureImportanceOverweight(healthy, threshold="0.3"))
    assert not fires(
        FeatureImportanceOverweight(healthy, nfeatures=3, tensor_regex="feature_importance/nothing")
    )
    assert fires(FeatureImportanceOverweight(healthy, nfeatures="8", threshold=0.99))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda t: TreeDepth(t, depth="deep"), "TreeDepth: parameter depth='deep' is not a number"),
        (lambda t: TreeDepth(t, depth=-1), "depth=-1 is out of range"),
        (lambda t: FeatureImportanceOverweight(t, threshold="1.5"), "threshold='1.5' is out of range"),
        (lambda t: FeatureImportanceOverweight(t, threshold="high"), "threshold='high' is not a number"),
        (lambda t: FeatureImportanceOverweight(t, nfeatures="0"), "nfeatures='0' is out of range"),
        (lambda t: FeatureImportanceOverweight(t, nfeatures="2.5"), "nfeatures='2.5' is not an integer"),
        (
            lambda t: FeatureImportanceOverweight(t, tensor_regex="("),
            "tensor_regex='\\(' is not a valid regular",
        ),
        (lambda t: FeatureImportanceOverweight(t, tensor_regex=""), "tensor_regex='' is empty"),
    ],
)
def test_bad_parameters_are_named(tmp_path, features, make, message):
    X, _ = features
    trial, _ = run(str(tmp_path / "run"), X, (X[:, 0] > 0).astype(float), ["feature_importance"], rounds=1)
    with pytest.raises(SMDebugValueError, match=message):
        make(trial)


def test_rules_by_name_through_the_core(tmp_path, features):
    from smdebug.rules import rule_configs
    from smdebug.rules.builtin import builtin_rules, create_rule

    X, rng = features
    noise = (rng.normal(size=len(X)) > 0).astype(float)
    trial, _ = run(
        str(tmp_path / "run"), X, noise, ["trees", "feature_importance"], max_depth=5, min_child_weight=0
    )
    assert builtin_rules()["tree_depth"] is TreeDepth
    rule = create_rule("tree_depth", trial, depth="4")
    assert isinstance(rule, TreeDepth) and rule.depth == 4 and fires(rule)
    rule = create_rule(rule_configs.tree_depth(), trial, depth="5")  # SageMaker's configuration form
    assert isinstance(rule, TreeDepth) and not fires(rule)
    rule = create_rule("FeatureImportanceOverweight", trial, threshold="0.95", nfeatures="8")
    assert fires(rule)  # the 8 features hold all the importance
    with pytest.raises(SMDebugValueError, match="depth"):
        create_rule("tree_depth", trial, dept="4")


def test_smdebug_rules_command(tmp_path, features):
    X, rng = features
    noise = (rng.normal(size=len(X)) > 0).astype(float)
    out = str(tmp_path / "run")
    run(out, X, noise, ["trees"], max_depth=6, min_child_weight=0)
    smdebug = str(Path(sys.executable).parent / "smdebug")
    done = subprocess.run(
        [smdebug, "rules", out, "--rule", "tree_depth", "--param", "depth=4"], capture_output=True, text=True
    )
    assert done.returncode == 1, done.stdout + done.stderr  # fired
    assert "FIRED" in done.stdout and "deep" in done.stdout
    done = subprocess.run(
        [smdebug, "rules", out, "--rule", "tree_depth", "--param", "depth=6"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_overtraining_on_a_boosters_global_steps_does_not_call_a_validation_metric_training(tmp_path):
    out = str(tmp_path / "run")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    y = (rng.random(300) > 0.5).astype(float)  # noise: the validation loss stops improving at once
    dtrain, dvalid = xgb.DMatrix(X[:200], label=y[:200]), xgb.DMatrix(X[200:], label=y[200:])
    hook = smd.Hook(out, save_config=smd.SaveConfig(save_interval=1))
    params = {"objective": "binary:logistic", "max_depth": 6, "eta": 0.5, "nthread": 1}
    xgb.train(params, dtrain, 12, evals=[(dvalid, "validation")], callbacks=[hook])
    hook.close()
    result = smdebug_cli("rules", out, "--rule", "overtraining", env={"COLUMNS": "250"})
    assert "FIRED" in result.stdout and "validation-logloss: loss has not improved" in result.stdout, (
        result.stdout
    )
