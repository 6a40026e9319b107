"""Actions: a rule stops training in-process (hook.add_rule) or from a sidecar (smdebug rules --watch)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from numpy_runs import make_hook, train

import smdebug
from smdebug.exceptions import RuleEvaluationConditionMet, SMDebugValueError, StopTraining
from smdebug.rules import Rule
from smdebug.rules.actions import (
    LOCAL_SIGNAL_CHECK_SECONDS,
    STOP_SIGNAL_FILE,
    read_stop_signal,
    write_stop_signal,
)
from smdebug.trials import create_trial

HERE = Path(__file__).parent


def test_a_firing_rule_stops_training(tmp_path):
    out = str(tmp_path / "run")
    hook = make_hook(out)
    rule = hook.add_rule("exploding_tensor", collection_names="weights")
    assert type(rule).__name__ == "ExplodingTensor"
    with pytest.raises(StopTraining) as info:
        train(hook, lr=1e6)
    hook.close()
    stop = info.value
    assert isinstance(stop, RuleEvaluationConditionMet)  # what smdebug users already catch
    assert stop.rule_name == "ExplodingTensor" and stop.step == 3 and "NaN or infinite" in str(stop)
    assert hook.should_stop() and hook.stop_reason is stop
    assert [(r.rule, r.step) for r in hook.rule_results] == [("ExplodingTensor", 3)]
    # raised as step 4 began: steps 0-3 are saved, training went no further
    assert create_trial(out).steps() == [0, 1, 2, 3]
    assert read_stop_signal(out)["rule"] == "ExplodingTensor"  # so every worker stops


def test_healthy_training_is_not_stopped(tmp_path):
    hook = make_hook(str(tmp_path / "run"))
    hook.add_rule("exploding_tensor", collection_names="weights")
    hook.add_rule("vanishing_gradient", threshold="1e-9")
    assert train(hook, lr=0.01, steps=8) == 8
    hook.close()
    assert not hook.should_stop() and hook.stop_reason is None and hook.rule_results == []


def test_action_none_only_records(tmp_path, caplog):
    hook = make_hook(str(tmp_path / "run"))
    hook.add_rule("loss_not_decreasing", action=None, num_steps="3")
    assert train(hook, lr=0.0, steps=8) == 8
    hook.close()
    assert not hook.should_stop()
    assert [r.step for r in hook.rule_results] == [3, 6]
    assert "rule LossNotDecreasing fired at step 3" in caplog.text


def test_firings_during_training_are_recorded_in_the_run(tmp_path, capsys):
    """A rule with action None that fires: its firings are in the run (rules/<worker>.json), in
    trial.rule_firings() and in `smdebug ls`, though training went on."""
    out = str(tmp_path / "run")
    hook = make_hook(out)
    hook.add_rule("loss_not_decreasing", action=None, num_steps="3")
    hook.set_mode(smdebug.modes.TRAIN)
    assert train(hook, lr=0.0, steps=8) == 8
    hook.close()
    assert (Path(out) / "rules" / "worker_0.json").is_file()
    firings = create_trial(out).rule_firings()
    assert [(f["rule"], f["step"], f["mode"], f["worker"]) for f in firings] == [
        ("LossNotDecreasing", 3, "TRAIN", "worker_0"),
        ("LossNotDecreasing", 6, "TRAIN", "worker_0"),
    ]
    assert firings[0]["actions"] == [] and firings[0]["reason"] and firings[0]["time"] > 0
    from smdebug.cli import main

    assert main(["ls", out]) == 0
    assert (
        "Rule firings during training: LossNotDecreasing at steps 3, 6 (worker_0)" in capsys.readouterr().out
    )


def test_firings_an_earlier_job_of_the_run_recorded_are_kept(tmp_path):
    """A run resumed after preemption: the worker's record already holds the first job's firings."""
    out = tmp_path / "run"
    (out / "rules").mkdir(parents=True)
    earlier = {"worker": "worker_0", "firings": [{"rule": "Old", "step": 1, "reason": "r", "time": 1.0}]}
    (out / "rules" / "worker_0.json").write_text(json.dumps(earlier))
    hook = make_hook(str(out))
    hook.add_rule("loss_not_decreasing", action=None, num_steps="3")
    train(hook, lr=0.0, steps=8)
    hook.close()
    firings = create_trial(str(out)).rule_firings()
    assert [(f["rule"], f["step"]) for f in firings] == [
        ("Old", 1),
        ("LossNotDecreasing", 3),
        ("LossNotDecreasing", 6),
    ]


def test_a_run_without_firings_has_none(tmp_path):
    out = str(tmp_path / "run")
    hook = make_hook(out)
    hook.add_rule("exploding_tensor", collection_names="weights")
    train(hook, lr=0.01, steps=4)
    hook.close()
    assert create_trial(out).rule_firings() == []
    assert not (Path(out) / "rules").exists()


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"firings": [{"rule": "R", "step": NaN}]}',
        b'{"firings": [{"rule": 3, "step": 1}]}',
        b"[1]",
    ],
)
def test_a_hostile_firings_file_is_skipped_with_a_warning(tmp_path, caplog, content):
    out = tmp_path / "run"
    hook = make_hook(str(out))
    hook.add_rule("loss_not_decreasing", action=None, num_steps="3")
    train(hook, lr=0.0, steps=4)
    hook.close()
    (out / "rules" / "worker_1.json").write_bytes(content)
    trial = create_trial(str(out))
    firings = trial.rule_firings()
    assert [(f["step"], f["worker"]) for f in firings] == [(3, "worker_0")]  # the good record stays
    assert trial.rule_firings() == firings  # asked again (the report does): warned of once
    assert caplog.text.count("rules/worker_1.json: malformed rule firings file") == 1


def test_a_custom_rule_class_and_instance(tmp_path):
    class BigLoss(Rule):
        def __init__(self, base_trial, limit="100"):
            super().__init__(base_trial)
            self.limit = float(limit)

        def invoke_at_step(self, step):
            return any(
                self.base_trial.tensor(n).value(step).item() > self.limit
                for n in self.base_trial.tensor_names(collection="losses", step=step)
            )

    hook = make_hook(str(tmp_path / "run"))
    hook.add_rule(BigLoss, limit="1e6")
    with pytest.raises(StopTraining, match="BigLoss fired at step 1"):
        train(hook, lr=1e6)
    hook.close()


def test_a_custom_rule_with_the_walkthroughs_constructor(tmp_path):
    class BigLoss(Rule):
        def __init__(self, base_trial, other_trials, limit):  # as the walkthrough writes it
            super().__init__(base_trial, other_trials=other_trials)
            self.limit = float(limit)

        def invoke_at_step(self, step):
            return any(
                self.base_trial.tensor(n).value(step).item() > self.limit
                for n in self.base_trial.tensor_names(collection="losses", step=step)
            )

    hook = make_hook(str(tmp_path / "run"))
    rule = hook.add_rule(BigLoss, limit="1e6")
    assert rule.other_trials == []
    with pytest.raises(StopTraining, match="BigLoss fired at step 1"):
        train(hook, lr=1e6)
    hook.close()


def test_rules_are_checked_when_added(tmp_path):
    hook = make_hook(str(tmp_path / "run"))
    with pytest.raises(SMDebugValueError, match="threshold='tiny' is not a number"):
        hook.add_rule("vanishing_gradient", threshold="tiny")
    with pytest.raises(SMDebugValueError, match="unknown rule"):
        hook.add_rule("no_such_rule")
    with pytest.raises(SMDebugValueError, match="action 'email me' is not supported"):
        hook.add_rule("vanishing_gradient", action="email me")
    hook.close()


def test_a_rule_reading_a_collection_the_hook_does_not_save_is_warned_about(tmp_path, caplog):
    """vanishing_gradient on a hook that saves no gradients would judge nothing and never fire: adding
    it says so (SageMaker saves a rule's default collections for it); saved, or chosen otherwise: quiet."""
    caplog.set_level("WARNING", logger="smdebug")
    hook = make_hook(str(tmp_path / "run"), include=("weights",))
    hook.add_rule("vanishing_gradient")
    assert (
        "rule vanishing_gradient reads the 'gradients' collection, which this hook does not save"
        in caplog.text
    )
    caplog.clear()
    hook.add_rule("exploding_tensor", collection_names="weights")
    hook.add_rule("weight_update_ratio")
    hook.add_rule("loss_not_decreasing")  # losses are saved by default, in some collection
    hook.close()
    hook = make_hook(str(tmp_path / "run2"))
    hook.add_rule("vanishing_gradient")
    hook.close()
    assert "does not save" not in caplog.text


def test_the_hook_honours_a_stop_signal_at_its_next_step(tmp_path):
    out = str(tmp_path / "run")
    hook = make_hook(out)

    def sidecar(step):
        if step == 4:
            write_stop_signal(out, "SomeRule", 2, "planted")
            time.sleep(LOCAL_SIGNAL_CHECK_SECONDS)  # a local run's signal is looked for at most this often

    with pytest.raises(StopTraining) as info:
        train(hook, lr=0.01, on_step=sidecar)
    hook.close()
    assert info.value.source == "signal" and info.value.rule_name == "SomeRule" and info.value.step == 2
    # written after step 3's update: the next step's start (a framework's forward call) raised
    assert create_trial(out).steps() == [0, 1, 2, 3]


def test_an_old_stop_signal_is_not_for_a_new_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / STOP_SIGNAL_FILE).write_text('{"rule": "Old", "step": 1}')
    hook = make_hook(str(out))
    assert train(hook, lr=0.01, steps=3) == 3
    hook.close()
    assert not hook.should_stop()


def test_framework_neutral_api_for_other_plugins(tmp_path):
    """What a plugin such as XGBoost's uses: end_step evaluates, should_stop() says whether to stop."""
    hook = smdebug.BaseHook(
        out_dir=str(tmp_path / "run"),
        include_collections=["losses"],
        save_config=smdebug.SaveConfig(save_interval=1),
    )
    hook.get_collection("losses").include("loss")
    hook.add_rule("loss_not_decreasing", num_steps="2")
    stopped_at = None
    for step in range(10):
        hook.begin_step()
        hook.save_for_step("train-loss", np.array([1.0 - 0.0001 * step], dtype=np.float32))  # 0.01% a step
        hook.end_step()
        if hook.should_stop():
            stopped_at = step
            break
    hook.close()
    assert stopped_at == 2 and hook.stop_reason.rule_name == "LossNotDecreasing"


def _run(*args, **kwargs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent)]))
    return subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kwargs
    )


@pytest.mark.timeout(120)
def test_sidecar_watch_stops_a_live_run(tmp_path):
    out = str(tmp_path / "run")
    watcher = _run("-m", "smdebug", "rules", out, "--watch", "--rule", "exploding_tensor", "--timeout", "60")
    training = _run(str(HERE / "live_train.py"), out, "bad", "200")
    train_out, train_err = training.communicate(timeout=100)
    watch_out, watch_err = watcher.communicate(timeout=100)
    assert training.returncode == 0, train_err
    assert train_out.startswith("STOPPED") and "ExplodingTensor" in train_out, train_out + train_err
    assert int(train_out.split()[1]) < 100  # stopped long before its 200 steps
    assert watcher.returncode == 1, watch_err
    assert "exploding_tensor" in watch_out and "FIRED" in watch_out and "stop signal left" in watch_out
    assert read_stop_signal(out)["rule"] == "ExplodingTensor"


@pytest.mark.timeout(120)
def test_sidecar_watch_lets_a_healthy_run_finish(tmp_path):
    out = str(tmp_path / "run")
    watcher = _run("-m", "smdebug", "rules", out, "--watch", "--rule", "exploding_tensor", "--timeout", "60")
    training = _run(str(HERE / "live_train.py"), out, "good", "8")
    train_out, train_err = training.communicate(timeout=100)
    watch_out, watch_err = watcher.communicate(timeout=100)
    assert train_out.strip() == "COMPLETED", train_err
    assert watcher.returncode == 0, watch_out + watch_err
    assert "ok" in watch_out and read_stop_signal(out) is None
