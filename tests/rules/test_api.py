"""String parameters and their errors, rule_configs, create_rule, builtin_rules, plugin rules."""

import numpy as np
import numpy_runs
import pytest

import smdebug.rules
from smdebug import plugins
from smdebug.exceptions import SMDebugValueError
from smdebug.hookspecs import hookimpl
from smdebug.rules import Rule, builtin_rules, create_rule, evaluate_rule, invoke_rule, rule_configs
from smdebug.rules.actions import parse_actions
from smdebug.trials import create_trial

NAMES = [
    "vanishing_gradient",
    "exploding_tensor",
    "similar_across_runs",
    "weight_update_ratio",
    "all_zero",
    "unchanged_tensor",
    "loss_not_decreasing",
    "check_input_images",
    "dead_relu",
    "confusion",
    "class_imbalance",
    "overfit",
    "overtraining",
    "tensor_variance",
    "poor_weight_initialization",
    "saturated_activation",
    "nlp_sequence_ratio",
    "stalled_training_rule",
]
CLASSES = {
    "vanishing_gradient": "VanishingGradient",
    "exploding_tensor": "ExplodingTensor",
    "similar_across_runs": "SimilarAcrossRuns",
    "weight_update_ratio": "WeightUpdateRatio",
    "all_zero": "AllZero",
    "unchanged_tensor": "UnchangedTensor",
    "loss_not_decreasing": "LossNotDecreasing",
    "check_input_images": "CheckInputImages",
    "dead_relu": "DeadRelu",
    "confusion": "Confusion",
    "class_imbalance": "ClassImbalance",
    "overfit": "Overfit",
    "overtraining": "Overtraining",
    "tensor_variance": "TensorVariance",
    "poor_weight_initialization": "PoorWeightInitialization",
    "saturated_activation": "SaturatedActivation",
    "nlp_sequence_ratio": "NLPSequenceRatio",
    "stalled_training_rule": "StalledTrainingRule",
}
COLLECTIONS = {
    "vanishing_gradient": ("gradients", None),
    "loss_not_decreasing": ("losses", None),
    "weight_update_ratio": ("weights", None),
    "check_input_images": ("input_image", ".*hybridsequential0_input_0"),
    "dead_relu": ("relu_output", ".*relu_output"),
    "poor_weight_initialization": ("relu_input", ".*relu_input"),
    "nlp_sequence_ratio": ("input_sequence", ".*embedding0_input_0"),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("api") / "run")
    numpy_runs.vanishing_gradient(out, bad=False)
    return out


@pytest.fixture
def trial(run):
    return create_trial(run)


def test_builtin_rules_lists_every_rule_by_name():
    rules = builtin_rules()
    assert set(NAMES) <= set(rules)
    for name, cls_name in CLASSES.items():
        cls = rules[name]
        assert cls.__name__ == cls_name and issubclass(cls, Rule)
        assert getattr(smdebug.rules, cls_name) is cls  # importable from smdebug.rules
    from smdebug.rules.generic import VanishingGradient  # smdebug's older module path

    assert VanishingGradient is rules["vanishing_gradient"]


@pytest.mark.parametrize("name", NAMES)
def test_rule_configs(name):
    config = getattr(rule_configs, name)()
    debug = config["DebugRuleConfiguration"]
    assert debug["RuleConfigurationName"] == CLASSES[name]
    assert debug["RuleParameters"] == {"rule_to_invoke": CLASSES[name]}
    if name in COLLECTIONS:
        coll, regex = COLLECTIONS[name]
        [entry] = config["CollectionConfigurations"]
        assert entry["CollectionName"] == coll
        assert entry["CollectionParameters"]["save_interval"] == "500"
        assert entry["CollectionParameters"].get("include_regex") == regex
    else:
        assert "CollectionConfigurations" not in config
    assert getattr(rule_configs, name)() is not config  # a fresh dict each call


def test_rule_configs_of_the_xgboost_rules():
    assert rule_configs.tree_depth()["DebugRuleConfiguration"]["RuleConfigurationName"] == "TreeDepth"
    fio = rule_configs.feature_importance_overweight()
    assert fio["CollectionConfigurations"][0]["CollectionName"] == "feature_importance"


def test_create_rule_with_string_parameters(trial):
    rule = create_rule("vanishing_gradient", trial, threshold="1e-7")
    assert type(rule).__name__ == "VanishingGradient" and rule.threshold == 1e-7
    assert create_rule("VanishingGradient", trial).threshold == 0.0000001  # class names work too
    rule = create_rule("exploding_tensor", trial, collection_names="gradients, weights", only_nan="False")
    assert rule.collection_names == ["gradients", "weights"] and rule.only_nan is False
    rule = create_rule(
        "loss_not_decreasing", trial, num_steps="5", mode="train", use_losses_collection="True"
    )
    assert rule.num_steps == 5 and rule.mode.name == "TRAIN"
    rule = create_rule("nlp_sequence_ratio", trial, token_values="3, 0", token_thresholds_percent="50,40")
    assert rule.token_values == [3, 0] and rule.token_thresholds_percent == [50, 40]
    rule = create_rule("tensor_variance", trial, tensor_regex="loss, losses", max_threshold="None")
    assert rule.tensor_regex == ["loss", "losses"] and rule.max_threshold is None


def test_create_rule_from_a_rule_config(trial):
    rule = create_rule(rule_configs.dead_relu(), trial, threshold_layer="60")
    assert type(rule).__name__ == "DeadRelu" and rule.threshold_layer == 60.0
    config = rule_configs.exploding_tensor()
    config["DebugRuleConfiguration"]["RuleParameters"]["tensor_regex"] = ".*"
    assert create_rule(config, trial).tensor_regex == [".*"]


@pytest.mark.parametrize(
    "name,params,message",
    [
        (
            "vanishing_gradient",
            {"threshold": "abc"},
            "VanishingGradient: parameter threshold='abc' is not a number",
        ),
        ("vanishing_gradient", {"threshold": "-1"}, "threshold='-1' is out of range"),
        ("exploding_tensor", {"only_nan": "maybe"}, "only_nan='maybe' is not a boolean"),
        (
            "exploding_tensor",
            {"tensor_regex": "(unclosed"},
            "tensor_regex='(unclosed' is not a valid regular",
        ),
        (
            "unchanged_tensor",
            {"collection_names": "weights", "num_steps": "2.5"},
            "num_steps='2.5' is not an integer",
        ),
        ("loss_not_decreasing", {"diff_percent": "150"}, "diff_percent='150' is out of range"),
        ("loss_not_decreasing", {"mode": "training"}, "mode='training' is not a mode"),
        ("confusion", {"min_diag": "1.5"}, "min_diag='1.5' is out of range"),
        ("class_imbalance", {"samples": "many"}, "samples='many' is not an integer"),
        ("nlp_sequence_ratio", {"token_values": "0,3"}, "one threshold per token"),
        ("nlp_sequence_ratio", {"token_values": "a"}, "token_values='a' holds 'a', which is not a number"),
        ("all_zero", {}, "give collection_names or tensor_regex"),
        ("unchanged_tensor", {}, "give collection_names or tensor_regex"),
        ("tensor_variance", {}, "give collection_names or tensor_regex"),
        ("similar_across_runs", {}, "parameter other_trial is required"),
        (
            "vanishing_gradient",
            {"treshold": "1"},
            "unknown parameter treshold='1'; did you mean 'threshold'?",
        ),
        ("stalled_training_rule", {"threshold": "soon"}, "threshold='soon' is not a number"),
    ],
)
def test_bad_parameters_are_clear_errors(trial, name, params, message):
    with pytest.raises(SMDebugValueError) as info:
        create_rule(name, trial, **params)
    assert message in str(info.value)


def test_unknown_rule_name(trial):
    with pytest.raises(
        SMDebugValueError, match="unknown rule 'vanishing_gradiant'; did you mean 'vanishing_gradient'"
    ):
        create_rule("vanishing_gradiant", trial)


def test_rule_classes_take_parameters_directly(trial):
    rule = smdebug.rules.VanishingGradient(trial, threshold="0.01")
    assert rule.threshold == 0.01 and rule.rule_name == "VanishingGradient"
    assert invoke_rule(rule, end_step=2) == []  # healthy gradients are above 0.01


class TwoStepRule(Rule):
    """A plugin's rule: fires at step 1."""

    def __init__(self, base_trial, at="1"):
        super().__init__(base_trial)
        self.at = int(at)

    def invoke_at_step(self, step):
        return step == self.at


class RulesPlugin:
    @hookimpl
    def smdebug_rules(self):
        return {"two_step": TwoStepRule}


def test_rules_contributed_by_plugins(trial):
    plugins.get_plugin_manager().register(RulesPlugin(), name="test-rules-plugin")
    assert builtin_rules()["two_step"] is TwoStepRule
    assert "two_step" in plugins.rules()
    rule = create_rule("two_step", trial, at="2")
    assert evaluate_rule(rule) == [2]
    with pytest.raises(SMDebugValueError, match="TwoStepRule: unknown parameter when='2'"):
        create_rule("two_step", trial, when="2")


def test_walkthrough_custom_rule_still_works(trial):
    class CustomGradientRule(Rule):
        def __init__(self, base_trial, threshold=10.0):
            super().__init__(base_trial)
            self.threshold = float(threshold)

        def invoke_at_step(self, step):
            for tname in self.base_trial.tensor_names(collection="gradients"):
                t = self.base_trial.tensor(tname)
                abs_mean = t.reduction_value(step, "mean", abs=True)
                if abs_mean > self.threshold:
                    return True
            return False

    assert evaluate_rule(CustomGradientRule(trial, threshold="1e-9")) == [0, 1, 2, 3]
    assert evaluate_rule(CustomGradientRule(create_trial(trial.path), threshold="20.0")) == []


def test_walkthrough_constructor_passes_other_trials_second(trial):
    """The walkthrough's signature is (base_trial, other_trials, <parameters>); a subclass handing its
    other trials on positionally gets them as other_trials, not as an action."""

    class CompareRule(Rule):
        def __init__(self, base_trial, other_trials, threshold="0.5"):
            super().__init__(base_trial, other_trials)
            self.threshold = float(threshold)

        def invoke_at_step(self, step):
            return step >= self.threshold and len(self.other_trials) == 1

    other = create_trial(trial.path)
    rule = CompareRule(trial, [other], threshold="2")
    assert rule.other_trials == [other] and rule.trials == [trial, other]
    assert rule.action_str == ""
    assert invoke_rule(rule, end_step=4) == [2, 3]  # firing runs no action
    assert CompareRule(trial, None).other_trials == []


def test_parse_actions():
    assert parse_actions("stoptraining") == {"stoptraining"}
    assert parse_actions("StopTraining") == {"stoptraining"}
    assert parse_actions('[{"name": "StopTraining", "training_job_prefix": "job"}]') == {"stoptraining"}
    assert parse_actions(None) == set() and parse_actions("") == set()
    with pytest.raises(SMDebugValueError, match="action 'reboot' is not supported"):
        parse_actions("reboot")


def test_a_rules_actions_are_checked_when_it_is_built(trial, caplog):
    """A bad action is an error naming the rule when the rule is made (smdebug 1.0 parses its action
    string in the constructor too), not the first time it fires; an action that needs AWS (email, sms)
    is warned about once, not at every firing."""

    class EveryOtherStep(Rule):
        def __init__(self, base_trial, action_str=""):
            super().__init__(base_trial, action_str)

        def invoke_at_step(self, step):
            return step % 2 == 0

    with pytest.raises(SMDebugValueError, match="EveryOtherStep: action 'reboot' is not supported"):
        EveryOtherStep(trial, "reboot")
    with pytest.raises(SMDebugValueError, match="VanishingGradient: action '{bad' is not valid JSON"):
        create_rule("vanishing_gradient", trial, action_str="{bad")
    caplog.set_level("WARNING", logger="smdebug")
    rule = EveryOtherStep(trial, '{"name": "email", "endpoint": "someone@example.com"}')
    assert evaluate_rule(rule) == [0, 2]
    assert [r.getMessage() for r in caplog.records].count(
        "smdebug: the email action needs SageMaker; it is ignored here"
    ) == 1


def test_smdebug_1_exceptions_a_rule_may_use(trial):
    """smdebug 1.0's exceptions are importable, and a rule raising NoMoreProfilerData ends invoke_rule
    quietly with what fired so far, as 1.0's invoker does."""
    from smdebug.exceptions import NoMoreProfilerData, SMDebugCustomerError, SMDebugError

    assert issubclass(SMDebugCustomerError, SMDebugError)

    class UntilStepTwo(Rule):
        def invoke_at_step(self, step):
            if step == 2:
                raise NoMoreProfilerData(1234)
            return True

    assert invoke_rule(UntilStepTwo(trial)) == [0, 1]


def test_numpy_helpers_of_rules_on_odd_tensors(tmp_path):
    """Rules judge boolean tensors and skip empty ones instead of failing."""
    import smdebug

    out = str(tmp_path / "odd")
    hook = smdebug.BaseHook(
        out_dir=out, include_collections=["default"], save_config=smdebug.SaveConfig(save_interval=1)
    )
    hook.begin_step()
    hook.save_tensor("empty", np.zeros((0, 3), dtype=np.float32))
    hook.save_tensor("flags", np.array([True, False]))
    hook.end_step()
    hook.close()
    trial = create_trial(out)
    for name, params, fired in [
        ("exploding_tensor", {}, []),
        ("all_zero", {"tensor_regex": ".*"}, []),
        ("all_zero", {"tensor_regex": "flags", "threshold": "50"}, [0]),
        ("tensor_variance", {"tensor_regex": ".*", "min_threshold": "1"}, [0]),
        ("dead_relu", {"tensor_regex": ".*"}, []),
    ]:
        assert evaluate_rule(create_rule(name, trial, **params)) == fired, name


def test_a_rule_that_checked_nothing_says_so(tmp_path, caplog):
    import numpy_runs

    out = str(tmp_path / "run")
    hook = numpy_runs.make_hook(out, include=("weights", "losses"))
    numpy_runs.train(hook, lr=0.05, steps=3)
    hook.close()
    trial = create_trial(out)
    caplog.set_level("WARNING", logger="smdebug")
    rule = create_rule("vanishing_gradient", trial)
    assert evaluate_rule(rule) == []
    assert "nothing to check" in rule.nothing_checked()
    assert [r.getMessage() for r in caplog.records if "nothing to check" in r.getMessage()] == [
        f"smdebug: VanishingGradient: {rule.nothing_checked()}"
    ]
    rule = create_rule("exploding_tensor", trial)
    assert evaluate_rule(rule) == [] and rule.nothing_checked() == ""


def test_tensors_saved_in_a_form_a_rule_cannot_judge_are_no_data(tmp_path):
    import numpy_runs

    out = str(tmp_path / "run")
    hook = numpy_runs.NumpyHook(
        out_dir=out,
        save_config=smdebug.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients"],
        reduction_config=smdebug.ReductionConfig(norms=["l2"]),  # none of what the rules below judge
    )
    numpy_runs.train(hook, lr=0.05, steps=3)
    hook.close()
    for name, params in [
        ("vanishing_gradient", {}),
        ("all_zero", {"collection_names": "weights"}),
        ("unchanged_tensor", {"collection_names": "weights"}),
        ("tensor_variance", {"collection_names": "weights", "min_threshold": "0.001"}),
    ]:
        rule = create_rule(name, create_trial(out), **params)
        assert evaluate_rule(rule) == [], name
        assert "nothing it can judge" in rule.nothing_checked(), name
    # the saved l2 is what exploding_tensor judges (a non-finite tensor has a non-finite l2)
    rule = create_rule("exploding_tensor", create_trial(out))
    assert evaluate_rule(rule) == [] and rule.nothing_checked() == ""


def test_similar_across_runs_names_an_other_run_that_is_not_there(run, tmp_path):
    with pytest.raises(SMDebugValueError, match="other_trial: .*nowhere: no such file or directory"):
        create_rule("similar_across_runs", create_trial(run), other_trial=str(tmp_path / "nowhere"))
    other = str(tmp_path / "other")  # a run that shares no tensor with this one: nothing compared
    hook = numpy_runs.make_hook(other, include=("losses",))
    numpy_runs.train(hook, lr=0.05, steps=2)
    hook.close()
    rule = create_rule(
        "similar_across_runs", create_trial(run), other_trial=other, collection_names="weights"
    )
    assert evaluate_rule(rule) == [] and "nothing it can judge" in rule.nothing_checked()
