"""The Rule API: the walkthrough's CustomGradientRule as written there, and invoke_rule."""

import threading
import time

import numpy as np
import pytest

import smdebug
from smdebug.exceptions import NoMoreData, RuleEvaluationConditionMet, SMDebugValueError
from smdebug.hook import BaseHook
from smdebug.rules.rule import Rule
from smdebug.rules.rule_invoker import evaluate_rule, invoke_rule
from smdebug.trials import create_trial


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


def write_gradients(out, values, interval=1, delay=0.0):
    hook = BaseHook(
        out_dir=out, save_config=smdebug.SaveConfig(save_interval=interval), include_collections=["gradients"]
    )
    hook.get_collection("gradients").include("gradient/.*")
    for v in values:
        hook.begin_step()
        hook.save_for_step("gradient/fc.weight", np.full((2, 2), v, dtype=np.float32))
        hook.save_for_step("gradient/fc.bias", np.full(2, -v / 2, dtype=np.float32))
        hook.end_step()
        time.sleep(delay)
    hook.close()


def test_custom_gradient_rule_fires(tmp_path):
    out = str(tmp_path / "run")
    write_gradients(out, [1, 2, 30, 4])
    trial = create_trial(out)
    rule = CustomGradientRule(trial, threshold="20.0")  # parameters arrive as strings
    with pytest.raises(RuleEvaluationConditionMet) as info:
        invoke_rule(rule, raise_eval_cond=True)
    assert info.value.step == 2 and info.value.rule_name == "CustomGradientRule"


def test_invoke_rule_raises_no_more_data_at_the_end_of_a_finished_run(tmp_path):
    # smdebug 1.0: "NoMoreData: raised when the training ends"; evaluation stops there, not before
    out = str(tmp_path / "run")
    write_gradients(out, [1, 2, 30, 4, 50])
    rule = CustomGradientRule(create_trial(out), threshold="20.0")
    with pytest.raises(NoMoreData) as end:
        invoke_rule(rule, start_step=0, end_step=None)
    assert end.value.step == 5 and end.value.last_step == 4 and end.value.fired_steps == [2, 4]
    with pytest.raises(NoMoreData):  # an end_step past the last step too, with raise_eval_cond and no firing
        invoke_rule(CustomGradientRule(create_trial(out), threshold=100), end_step=100, raise_eval_cond=True)
    with pytest.raises(NoMoreData):  # a start past the end evaluates nothing
        invoke_rule(CustomGradientRule(create_trial(out), threshold=1), start_step=20)
    assert invoke_rule(rule, end_step=5) == [2, 4]  # an end_step within the run returns normally
    assert evaluate_rule(CustomGradientRule(create_trial(out), threshold="20.0")) == [2, 4]
    assert evaluate_rule(CustomGradientRule(create_trial(out), threshold=100)) == []


def test_invoke_rule_start_end_and_unsaved_steps(tmp_path):
    out = str(tmp_path / "run")
    write_gradients(out, [30] * 25, interval=5)
    rule = CustomGradientRule(create_trial(out), threshold=1)
    assert invoke_rule(rule, start_step=3, end_step=16) == [5, 10, 15]


def test_rule_follows_a_live_run(tmp_path):
    out = str(tmp_path / "run")
    writer = threading.Thread(target=write_gradients, args=(out, [1, 1, 1, 40, 1]), kwargs={"delay": 0.2})
    writer.start()
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                trial = create_trial(out)
                break
            except Exception:
                time.sleep(0.05)
        trial.refresh_interval = 0.05
        rule = CustomGradientRule(trial, threshold=20)
        with pytest.raises(RuleEvaluationConditionMet) as info:
            invoke_rule(rule, raise_eval_cond=True)
        assert info.value.step == 3
    finally:
        writer.join()


def test_string_parameters_are_parsed_with_clear_errors(tmp_path):
    out = str(tmp_path / "run")
    write_gradients(out, [1])
    rule = CustomGradientRule(create_trial(out))
    assert rule.parse_bool("only_nan", "True") is True and rule.parse_bool("x", "false") is False
    assert rule.parse_list("loss, losses") == ["loss", "losses"]
    with pytest.raises(SMDebugValueError, match="threshold='abc' is not a number"):
        rule.parse_float("threshold", "abc")
    with pytest.raises(SMDebugValueError, match="base_trial is required"):
        CustomGradientRule(None)
