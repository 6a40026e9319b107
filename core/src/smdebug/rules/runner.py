"""The in-training rule runner: a core plugin on the observation hooks.

``hook.add_rule(...)`` gives a hook a RuleRunner (none before: a hook without rules pays nothing for
them). At the end of each step it saved, the runner waits for the step to be written, reads it back
through a Trial of the run, and evaluates the rules; a rule whose action is ``stoptraining`` that fires
asks the hook's stop state (smdebug.stop_signal) to stop training. Every firing (whatever its action) is
also recorded in the run (smdebug.firings: ``rules/<worker>.json``, a folder smdebug 1.0 never lists), which
``Trial.rule_firings()``, ``smdebug ls`` and the report read. The runner uses only the hook's public
queries (``out_dir``, ``writing``, ``last_saved_step``, ``wait_for_writer``, ``written_steps``):
data flows from the hook to the rules, never back into the hook's writing.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from smdebug.exceptions import (
    NoMoreData,
    RuleEvaluationConditionMet,
    SMDebugValueError,
    StepNotYetAvailable,
    StepUnavailable,
    StopTraining,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from smdebug.firings import FiringsRecord
from smdebug.hookspecs import hookimpl
from smdebug.rules.actions import STOP_TRAINING, parse_actions

if TYPE_CHECKING:
    from smdebug.hook import BaseHook
    from smdebug.stop_signal import StopSignal

logger = logging.getLogger("smdebug")

# How long a hook waits for its own step to be readable before skipping rule evaluation.
STEP_WAIT_SECONDS = 60.0
# How long the training thread waits for the writer to publish a step its rules judge.
RULE_FLUSH_SECONDS = 10.0

_runners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # hook -> its RuleRunner


@dataclass
class RuleResult:
    """A rule that fired: its name, the step, and why."""

    rule: str
    step: int
    reason: str = ""


def runner_of(hook: BaseHook, stop_signal: StopSignal | None = None) -> RuleRunner | None:
    """The hook's rule runner; made (with the hook's stop state) when ``stop_signal`` is given."""
    runner = _runners.get(hook)
    if runner is None and stop_signal is not None:
        runner = _runners[hook] = RuleRunner(hook, stop_signal)
    return runner


@hookimpl
def smdebug_step_end(hook, step):
    runner = _runners.get(hook)
    if runner is not None:
        runner.step_ended(step)


@hookimpl
def smdebug_hook_closed(hook):
    runner = _runners.get(hook)
    if runner is not None:  # no more steps to judge: the rules go (the results stay)
        runner.entries.clear()
        runner.firings.close()


class _LiveTrial:
    """The hook's own run, opened as a Trial the first time a rule reads it."""

    def __init__(self, path: str):
        self.path = path
        self._trial = None

    def __getattr__(self, name):
        if self._trial is None:
            from smdebug.trials import create_trial

            self._trial = create_trial(self.path)
        return getattr(self._trial, name)


@dataclass
class _Entry:
    rule: object
    actions: frozenset
    failed: bool = False


class RuleRunner:
    """Evaluates a hook's rules at the end of the steps it saved."""

    def __init__(self, hook: BaseHook, stop_signal: StopSignal):
        self.hook = hook
        self.stop_signal = stop_signal
        self.entries: list[_Entry] = []
        self.results: list[RuleResult] = []
        self.trial = _LiveTrial(hook.out_dir)
        self.firings = FiringsRecord(hook)

    def add(self, rule, action=STOP_TRAINING, params=None):
        from smdebug.rules.builtin import construct, create_rule
        from smdebug.rules.rule import Rule

        actions = parse_actions(action)
        params = dict(params or {})
        if isinstance(rule, Rule):
            if params:
                raise SMDebugValueError(
                    f"add_rule: parameters {sorted(params)} cannot be given with an already built rule"
                )
            obj = rule
        elif isinstance(rule, type) and issubclass(rule, Rule):
            obj = construct(rule, self.trial, params)
        else:
            obj = create_rule(rule, self.trial, **params)
        self.entries.append(_Entry(obj, actions))
        self._warn_unsaved(obj, params)
        if self.hook.dry_run:
            logger.warning("smdebug: the hook is a dry run: nothing is saved, so its rules never run")
        return obj

    def _warn_unsaved(self, rule, params: dict) -> None:
        """A built-in rule reading a built-in collection (gradients, weights, losses) that the hook does
        not save would judge nothing, silently: say so when it is added (SageMaker saves the collections
        of a rule's default configuration for it)."""
        from smdebug.rules import rule_configs

        name = getattr(rule, "name", "")
        if (
            name not in rule_configs.ALL
            or self.hook.save_all
            or {"collection_names", "tensor_regex"} & set(params)
        ):
            return
        for config in rule_configs.get(name).get("CollectionConfigurations", []):
            collection = config["CollectionName"]
            builtin = "include_regex" not in config["CollectionParameters"]
            # losses are saved by default, if not as "losses" then within another collection (XGBoost's
            # metrics): only the collections a hook saves when asked are checked
            if builtin and collection != "losses" and collection not in self.hook.include_collections:
                logger.warning(
                    "smdebug: rule %s reads the %r collection, which this hook does not save: it judges "
                    "nothing until the hook saves it (include_collections=[..., %r])",
                    name,
                    collection,
                    collection,
                )

    def step_ended(self, step: int) -> None:
        if self.entries and self._step_written(step):
            for entry in self.entries:
                if not entry.failed:
                    self._evaluate(entry, step)

    def _step_written(self, step: int) -> bool:
        hook = self.hook
        if not hook.writing or hook.last_saved_step != step:
            return False  # nothing was saved at this step: nothing new to judge
        # Rules read the step back: wait until the writer has published it (this makes the saving of
        # steps that rules judge synchronous, the price of judging them in-process), but not on a store
        # that fails or hangs: the step is then skipped.
        if not hook.wait_for_writer(RULE_FLUSH_SECONDS) or step not in hook.written_steps[-4:]:
            return False
        try:
            self.trial.wait_for_steps([step], timeout=STEP_WAIT_SECONDS)
        except Exception as exc:
            logger.warning("smdebug: rules skipped step %d: %s: %s", step, type(exc).__name__, exc)
            return False
        return True

    def _evaluate(self, entry: _Entry, step: int) -> None:
        rule = entry.rule
        name = getattr(rule, "rule_name", type(rule).__name__)
        try:
            rule.invoke(step)
        except RuleEvaluationConditionMet:
            reason = getattr(rule, "reason", "")
            self.results.append(RuleResult(name, step, reason))
            self.firings.add(name, step, reason, entry.actions)
            logger.warning("smdebug: rule %s fired at step %d%s", name, step, f": {reason}" if reason else "")
            if STOP_TRAINING in entry.actions:
                # written to the run too, so that every worker of a distributed run stops, not only this one
                self.stop_signal.request(StopTraining(name, step, reason), write_signal=self.hook.writing)
        except (
            TensorUnavailableForStep,
            TensorUnavailable,
            StepUnavailable,
            StepNotYetAvailable,
            NoMoreData,
        ):
            pass
        except Exception as exc:  # a broken rule never breaks training
            entry.failed = True
            logger.warning(
                "smdebug: rule %s failed at step %d and is no longer evaluated: %s: %s",
                name,
                step,
                type(exc).__name__,
                exc,
            )
