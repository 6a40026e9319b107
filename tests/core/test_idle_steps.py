"""Idle steps: between two steps that save nothing a plugin calls next_idle_step(), which skips working out
the due collections again. Whatever changes in between (a save configuration edited in place, a collection
added, the mode), the steps saved are those the configuration names."""

import time

import numpy as np
import pytest

import smdebug
from smdebug import modes, plugins
from smdebug.config import SaveConfigMode
from smdebug.exceptions import StopTraining
from smdebug.hook import BaseHook
from smdebug.plugin import hookimpl
from smdebug.rules.actions import LOCAL_SIGNAL_CHECK_SECONDS, write_stop_signal
from smdebug.rules.rule import Rule
from smdebug.rules.runner import runner_of
from smdebug.trials import create_trial


@pytest.mark.parametrize("interval", [1, 3, 7])
@pytest.mark.parametrize("start, end", [(0, None), (5, None), (4, 20), (0, 0), (9, 3)])
@pytest.mark.parametrize("save_steps", [[], [2, 11, 40], [0]])
def test_next_save_step_is_the_first_step_should_save_step_accepts(interval, start, end, save_steps):
    cfg = SaveConfigMode(save_interval=interval, start_step=start, end_step=end, save_steps=save_steps)
    for step in range(50):
        expected = next((s for s in range(step, 200) if cfg.should_save_step(s)), None)
        assert cfg.next_save_step(step) == expected, step


@pytest.mark.parametrize("interval", [1, 3])
@pytest.mark.parametrize("start, end", [(0, None), (5, None), (4, 20), (0, 0)])
@pytest.mark.parametrize("save_steps", [[], [2, 11, 20, 21, 40], [0, 1]])
def test_saves_until_never_passes_a_step_not_saved(interval, start, end, save_steps):
    # the hook takes the due collections of a saved step as those of the following steps until then
    cfg = SaveConfigMode(save_interval=interval, start_step=start, end_step=end, save_steps=save_steps)
    for step in (s for s in range(50) if cfg.should_save_step(s)):
        until = cfg.saves_until(step)
        assert until is None or until > step
        assert all(cfg.should_save_step(s) for s in range(step, 200 if until is None else until)), step


def train(hook, steps, on_step=None):
    """A plugin's loop: a step starts idle when it can, and saves "w" (its global step) when due."""
    for i in range(steps):
        if on_step:
            on_step(i)
        if not hook.next_idle_step():
            hook.end_step()
            hook.raise_if_stop_requested()
            hook.begin_step()
        hook.save_for_step("w", np.array([hook.step], dtype=np.int64))
    hook.close()


def make_hook(tmp_path, **kwargs):
    hook = BaseHook(out_dir=str(tmp_path / "run"), include_collections=["weights"], **kwargs)
    hook.get_collection("weights").include("^w$")
    return hook


def saved_steps(tmp_path):
    trial = create_trial(str(tmp_path / "run"))
    if "w" not in trial.tensor_names():
        return []
    steps = trial.tensor("w").steps()
    assert [trial.tensor("w").value(s).tolist() for s in steps] == [[s] for s in steps]
    return steps


def test_idle_steps_skip_the_due_collections_but_save_the_configured_steps(tmp_path):
    hook = make_hook(tmp_path, save_config=smdebug.SaveConfig(save_interval=10, save_steps=[13]))
    computed = []
    original = hook._collections_due
    hook._collections_due = lambda: computed.append(hook.step) or original()
    train(hook, 35)
    assert saved_steps(tmp_path) == [0, 10, 13, 20, 30]
    # worked out at each saved step and at the step after it (the first of an idle stretch) only
    assert computed == [0, 1, 10, 11, 13, 14, 20, 21, 30, 31]


EDITS = {
    "save_steps appended": lambda h: (
        h.get_collection("weights").save_config.get_save_config(modes.GLOBAL).save_steps.append(7)
    ),
    "save_steps item set": lambda h: (
        h.get_collection("weights").save_config.get_save_config(modes.GLOBAL).save_steps.__setitem__(0, 7)
    ),
    "save_interval set": lambda h: setattr(
        h.get_collection("weights").save_config.get_save_config(modes.GLOBAL), "save_interval", 7
    ),
    "save config of every mode set": lambda h: setattr(
        h.get_collection("weights").save_config, "save_steps", [7]
    ),
    "mode's config replaced": lambda h: h.get_collection("weights").save_config.set_save_config(
        modes.GLOBAL, SaveConfigMode(save_steps=[7], start_step=10**6)
    ),
    "collection's config replaced": lambda h: setattr(
        h.get_collection("weights"), "save_config", smdebug.SaveConfig(save_steps=[7], start_step=10**6)
    ),
}


@pytest.mark.parametrize("edit", EDITS)
def test_a_save_configuration_edited_between_idle_steps_takes_effect_at_the_next_step(tmp_path, edit):
    hook = make_hook(tmp_path, save_config=smdebug.SaveConfig(save_interval=1000, save_steps=[3]))
    train(hook, 12, on_step=lambda i: i == 5 and EDITS[edit](hook))
    assert 7 in saved_steps(tmp_path)
    assert saved_steps(tmp_path)[:2] == [0, 3]


STOPS = {
    "end_step set": lambda h: setattr(
        h.get_collection("weights").save_config.get_save_config(modes.GLOBAL), "end_step", 7
    ),
    "collection's config replaced": lambda h: setattr(
        h.get_collection("weights"), "save_config", smdebug.SaveConfig(save_steps=[7], start_step=10**6)
    ),
}


@pytest.mark.parametrize("edit", STOPS)
def test_a_save_configuration_edited_while_every_step_saves_takes_effect_at_the_next_step(tmp_path, edit):
    hook = make_hook(tmp_path, save_config=smdebug.SaveConfig(save_interval=1))
    asked = []  # the steps where the collections' save configurations were asked
    original = hook._included
    hook._included = lambda: asked.append(hook.step) or original()
    train(hook, 12, on_step=lambda i: i == 5 and STOPS[edit](hook))
    assert saved_steps(tmp_path) == ([0, 1, 2, 3, 4, 5, 6] if edit == "end_step set" else [0, 1, 2, 3, 4, 7])
    # asked again only once something changed (the edit, before step 5 begins)
    assert 0 in asked and 5 in asked and not {1, 2, 3, 4} & set(asked)


def test_a_collection_included_between_idle_steps_is_saved_at_its_steps(tmp_path):
    hook = make_hook(tmp_path, save_config=smdebug.SaveConfig(save_interval=1000))
    hook.get_collection("other").include("^w$")
    hook.get_collection("other").save_config = smdebug.SaveConfig(save_steps=[6])

    def save_x(i):
        if i == 4:  # "other" is included from now on
            hook.save_tensor("x", np.ones(2), collections_to_write="other")

    train(hook, 10, on_step=save_x)
    assert saved_steps(tmp_path) == [0, 6]
    assert create_trial(str(tmp_path / "run")).tensor("x").steps() == [3]


def test_idle_steps_of_each_mode_follow_that_modes_configuration(tmp_path):
    config = smdebug.SaveConfig(
        mode_save_configs={
            modes.TRAIN: SaveConfigMode(save_interval=4),
            modes.EVAL: SaveConfigMode(save_steps=[1, 2]),
        }
    )
    hook = make_hook(tmp_path, save_config=config)
    for mode, steps in [(modes.TRAIN, 6), (modes.EVAL, 4), (modes.TRAIN, 6)]:
        hook.set_mode(mode)
        for _ in range(steps):
            if not hook.next_idle_step():
                hook.end_step()
                hook.begin_step()
            hook.save_for_step("w", np.array([hook.step], dtype=np.int64))
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("w").steps(mode=modes.TRAIN) == [0, 4, 8]
    assert trial.tensor("w").steps(mode=modes.EVAL) == [0, 1, 2]  # and the default interval's 0
    assert trial.tensor("w").steps() == [0, 4, 6, 7, 8, 12]


def test_a_scalar_saved_at_an_idle_step_is_written_at_that_step(tmp_path):
    hook = make_hook(tmp_path, save_config=smdebug.SaveConfig(save_interval=1000))
    train(hook, 8, on_step=lambda i: i == 5 and hook.save_scalar("lr", 0.5))
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("scalar/lr").steps() == [4]  # saved before step 5 began: into step 4
    assert saved_steps(tmp_path) == [0]


def test_the_stop_signal_is_seen_between_idle_steps(tmp_path):
    out = str(tmp_path / "run")
    hook = make_hook(tmp_path)  # the default: every 500 steps

    def signal(i):
        if i == 5:
            write_stop_signal(out, "SomeRule", 3, "planted")
            time.sleep(LOCAL_SIGNAL_CHECK_SECONDS)

    with pytest.raises(StopTraining) as info:
        train(hook, 20, on_step=signal)
    hook.close()
    assert info.value.source == "signal" and info.value.rule_name == "SomeRule"
    assert hook.step == 4  # the step that would have begun after the signal never began


class StepEnds:
    """A plugin that observes step ends."""

    def __init__(self):
        self.steps = []

    @hookimpl
    def smdebug_step_end(self, hook, mode, step, mode_step):
        self.steps.append(step)


def test_a_plugin_observing_step_ends_sees_the_idle_ones(tmp_path):
    observer = StepEnds()
    plugins.get_plugin_manager().register(observer, name="step-ends")  # gone after the test (conftest)
    train(make_hook(tmp_path, save_config=smdebug.SaveConfig(save_steps=[3])), 8)
    assert observer.steps == list(range(8))
    assert saved_steps(tmp_path) == [0, 3]


class Judged(Rule):
    """A rule that records the steps it was asked to judge."""

    def __init__(self, base_trial):
        super().__init__(base_trial)
        self.steps = []

    def invoke_at_step(self, step):
        self.steps.append(step)


def test_idle_steps_leave_the_rule_runner_out_and_only_look_for_the_stop_signal(tmp_path, monkeypatch):
    monkeypatch.setenv("SMDEBUG_DISABLE_PLUGINS", "dummy")  # it observes step ends: none may, here
    plugins.reset()
    hook = make_hook(tmp_path, save_config=smdebug.SaveConfig(save_steps=[3]))
    rule = hook.add_rule(Judged, action=None)
    runner = runner_of(hook)
    ended, checked = [], []
    step_ended, check = runner.step_ended, hook._stop_signal.check
    runner.step_ended = lambda step: ended.append(step) or step_ended(step)
    hook._stop_signal.check = lambda: checked.append(hook.step) or check()
    train(hook, 8)
    assert ended == [0, 2, 3, 7]  # the steps ended by end_step: saved ones, the one before 3, the last
    assert rule.steps == [0, 3]  # of which the rule judges those saved
    assert checked == list(range(8))  # every step end looks for the stop signal, idle or not
    assert saved_steps(tmp_path) == [0, 3]
