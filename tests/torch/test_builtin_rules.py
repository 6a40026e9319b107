"""Each built-in rule on real tiny PyTorch trainings: it fires when its defect is planted and stays quiet
on a healthy run."""

import threading
import time

import pytest
import rule_scenarios as sc
import torch

from smdebug.exceptions import RuleEvaluationConditionMet, StopTraining
from smdebug.rules import create_rule, evaluate_rule, invoke_rule
from smdebug.trials import create_trial

# rule name, its parameters (strings, as configurations pass them), the scenario
CASES = [
    ("vanishing_gradient", {}, sc.vanishing_gradient),
    ("exploding_tensor", {}, sc.exploding_tensor),
    ("exploding_tensor", {"collection_names": "gradients", "only_nan": "True"}, sc.exploding_tensor),
    ("weight_update_ratio", {}, sc.weight_update_ratio),
    ("all_zero", {"tensor_regex": "relu_output"}, sc.all_zero),
    ("unchanged_tensor", {"collection_names": "weights"}, sc.unchanged_tensor),
    ("loss_not_decreasing", {}, sc.loss_not_decreasing),
    # a loss that diverges to infinity and NaN did not decrease either
    ("loss_not_decreasing", {"num_steps": "3"}, sc.exploding_tensor),
    ("check_input_images", {"regex": ".*ConvNet_input_0", "threshold_samples": "64"}, sc.check_input_images),
    ("dead_relu", {}, sc.dead_relu),
    ("confusion", {}, sc.confusion),
    ("class_imbalance", {}, sc.class_imbalance),
    ("overfit", {}, sc.overfit),
    ("overtraining", {}, sc.overtraining),
    (
        "tensor_variance",
        {"collection_names": "weights", "max_threshold": "10", "min_threshold": "0.00001"},
        sc.tensor_variance,
    ),
    ("poor_weight_initialization", {}, sc.poor_weight_initialization),
    ("saturated_activation", {}, sc.saturated_activation),
    ("nlp_sequence_ratio", {}, sc.nlp_sequence_ratio),
]


def fired_steps(path, name, **params):
    rule = create_rule(name, create_trial(path), **params)
    return evaluate_rule(rule), rule


@pytest.mark.parametrize("name,params,scenario", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_fires_on_the_defect_and_not_on_a_healthy_run(tmp_path, name, params, scenario):
    scenario(str(tmp_path / "bad"), bad=True)
    scenario(str(tmp_path / "good"), bad=False)
    fired, rule = fired_steps(str(tmp_path / "bad"), name, **params)
    assert fired, f"{name} did not fire on the planted defect"
    assert rule.reason  # says why, for the results table
    quiet, rule = fired_steps(str(tmp_path / "good"), name, **params)
    assert quiet == [], f"{name} fired on a healthy run at {quiet}: {rule.reason}"


def test_vanishing_gradient_names_the_vanished_gradient(tmp_path):
    sc.vanishing_gradient(str(tmp_path / "bad"), bad=True)
    fired, rule = fired_steps(str(tmp_path / "bad"), "vanishing_gradient")
    assert fired[0] == 0 and "gradient/DeepSigmoid_layers.0" in rule.reason
    # a threshold below the vanished gradients: quiet
    assert fired_steps(str(tmp_path / "bad"), "vanishing_gradient", threshold="1e-30")[0] == []


def test_loss_not_decreasing_checks_every_num_steps(tmp_path):
    sc.loss_not_decreasing(str(tmp_path / "bad"), bad=True)  # 22 steps of a flat loss
    assert fired_steps(str(tmp_path / "bad"), "loss_not_decreasing")[0] == [10, 20]
    assert fired_steps(str(tmp_path / "bad"), "loss_not_decreasing", num_steps="7")[0] == [7, 14, 21]
    # a rise is tolerated by nothing: diff_percent=0 still fires on a flat loss
    assert fired_steps(str(tmp_path / "bad"), "loss_not_decreasing", diff_percent="0")[0] == [10, 20]


def test_unchanged_tensor_needs_num_steps_saved_steps(tmp_path):
    sc.unchanged_tensor(str(tmp_path / "bad"), bad=True)
    assert fired_steps(str(tmp_path / "bad"), "unchanged_tensor", tensor_regex="fc1.weight")[0] == [2, 3, 4]
    fired, _ = fired_steps(
        str(tmp_path / "bad"), "unchanged_tensor", tensor_regex="fc1.weight", num_steps="5"
    )
    assert fired == [4]


def _train_and_evaluate(out, frozen):
    """Three rounds of 4 training steps then 3 evaluation steps (weights saved in both modes)."""
    torch.manual_seed(0)
    x, y = sc.regression_data()
    model, loss_fn = sc.MLP(), torch.nn.MSELoss()
    model.fc1.requires_grad_(not frozen)
    hook = sc.make_hook(out)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for _ in range(3):
        hook.set_mode(sc.smd.modes.TRAIN)
        for _ in range(4):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        hook.set_mode(sc.smd.modes.EVAL)
        with torch.no_grad():
            for _ in range(3):
                loss_fn(model(x), y)
    hook.close()


def test_unchanged_tensor_compares_weights_between_training_steps(tmp_path):
    """Weights do not change while a model is evaluated: on a healthy run that evaluates between
    rounds of training, unchanged_tensor stays quiet; a frozen layer still fires, at training steps."""
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    _train_and_evaluate(good, frozen=False)
    _train_and_evaluate(bad, frozen=True)
    quiet, rule = fired_steps(good, "unchanged_tensor", collection_names="weights")
    assert quiet == [], rule.reason
    fired, rule = fired_steps(bad, "unchanged_tensor", collection_names="weights")
    trial = create_trial(bad)
    assert fired and all(trial.mode_modestep(s)[0] == sc.smd.modes.TRAIN for s in fired), fired
    assert "fc1.weight" in rule.reason


def test_similar_across_runs(tmp_path):
    base, same, other = (str(tmp_path / n) for n in ("base", "same", "other"))
    sc.similar_across_runs(same, bad=False, other=base)
    sc.similar_across_runs(other, bad=True, other=str(tmp_path / "base2"))
    assert fired_steps(same, "similar_across_runs", other_trial=base)[0] == []
    fired, rule = fired_steps(other, "similar_across_runs", other_trial=str(tmp_path / "base2"))
    assert fired == [0, 1, 2] and "differs" in rule.reason
    # other_trials, as SageMaker passes the other jobs
    rule = create_rule("similar_across_runs", create_trial(other), other_trials=[create_trial(base)])
    assert evaluate_rule(rule) == [0, 1, 2]


def _train_quietly(scenario, out, bad):
    try:
        scenario(out, bad)
    except StopTraining:
        pass


def _follow_live(out, scenario, bad, threshold):
    trainer = threading.Thread(target=scenario, args=(out, bad))
    trainer.start()
    try:
        trial = create_trial(out)
        trial.refresh_interval = 0.1
        rule = create_rule("stalled_training_rule", trial, threshold=threshold)
        return evaluate_rule(rule), rule
    finally:
        trainer.join()


@pytest.mark.timeout(60)
def test_stalled_training_fires_when_a_live_run_pauses(tmp_path):
    start = time.monotonic()
    fired, rule = _follow_live(str(tmp_path / "bad"), sc.stalled_training, True, "1.5")
    assert fired and "no new data" in rule.reason
    assert time.monotonic() - start < 30


@pytest.mark.timeout(60)
def test_stalled_training_quiet_on_a_run_that_keeps_writing(tmp_path):
    fired, _ = _follow_live(str(tmp_path / "good"), sc.stalled_training, False, "3")
    assert fired == []


@pytest.mark.timeout(60)
def test_stalled_training_can_stop_training(tmp_path):
    from smdebug.rules.actions import read_stop_signal

    out = str(tmp_path / "bad")
    trainer = threading.Thread(target=_train_quietly, args=(sc.stalled_training, out, True))
    trainer.start()
    try:
        trial = create_trial(out)
        trial.refresh_interval = 0.1
        rule = create_rule("stalled_training_rule", trial, threshold="1.5", stop_training_on_fire="True")
        with pytest.raises(RuleEvaluationConditionMet):
            invoke_rule(rule, raise_eval_cond=True)
    finally:
        trainer.join()
    assert read_stop_signal(out)["rule"] == "StalledTrainingRule"
    # the hook honoured the signal: the forward call after the pause (step 3 of 6) raised StopTraining
    assert create_trial(out).steps() == [0, 1, 2]
