"""The Rule base class: subclass it and implement ``invoke_at_step``."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from smdebug.analysis.utils import no_refresh
from smdebug.exceptions import (
    RuleEvaluationConditionMet,
    SMDebugValueError,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from smdebug.rules import params
from smdebug.rules.req_tensors import RequiredTensors

logger = logging.getLogger("smdebug")


class Rule(ABC):
    """A check run at each step of ``base_trial`` (and possibly ``other_trials``).

    Parameters arrive as strings when rules are configured the SageMaker way; use ``self.parse_bool``
    and friends (or ``float(...)``) in ``__init__``.
    """

    def __init__(self, base_trial, action_str: str = "", other_trials=None):
        if base_trial is None:
            raise SMDebugValueError(f"{type(self).__name__}: base_trial is required")
        if other_trials is None and action_str is not None and not isinstance(action_str, str):
            # The walkthrough's constructor is (base_trial, other_trials, ...), so a subclass may pass
            # its trials second: they are the other trials, not an action.
            other_trials, action_str = action_str, ""
        if other_trials is not None and not isinstance(other_trials, (list, tuple, set)):
            other_trials = [other_trials]  # one Trial
        self.base_trial = base_trial
        self.other_trials = list(other_trials or [])
        self.trials = [base_trial, *self.other_trials]
        self.rule_name = type(self).__name__
        self.action_str = action_str
        self.logger = logger
        self.req_tensors = RequiredTensors(base_trial, self.other_trials)
        self._evaluated = self._skipped = 0  # steps evaluated; steps skipped for a missing tensor

    @property
    def action_str(self) -> str:
        return self._action_str

    @action_str.setter
    def action_str(self, value) -> None:
        # parsed when given, so that a bad action is an error here, not at the first firing, and an
        # action that needs AWS is warned about once
        from smdebug.rules.actions import parse_actions

        try:
            self._actions = parse_actions(value)
        except SMDebugValueError as exc:
            raise SMDebugValueError(f"{type(self).__name__}: {exc}") from None
        self._action_str = value

    def set_required_tensors(self, step: int) -> None:  # noqa: B027 (optional, not abstract)
        """Optionally declare the tensors a step needs: ``self.req_tensors.add(name, steps)`` (or
        ``add(regex, steps, should_match_regex=True)``, ``trial=`` for another trial). ``invoke`` waits
        for them and reads them first; one that is missing skips the step."""

    @abstractmethod
    def invoke_at_step(self, step: int) -> bool:
        """Return True when the rule's condition is met at this step."""

    def invoke(self, step: int) -> None:
        """Wait for the step, evaluate it, and raise RuleEvaluationConditionMet when the rule fires."""
        self.base_trial.wait_for_steps([step])
        # the step is there: evaluate it on what the trials hold now, without re-reading them per query
        with no_refresh(self.trials):
            self.req_tensors.clear()
            try:
                self.set_required_tensors(step)
                self.req_tensors.fetch()
                fired = self.invoke_at_step(step)
            except (TensorUnavailableForStep, TensorUnavailable, StepUnavailable):
                self._skipped = getattr(self, "_skipped", 0) + 1
                raise
        self._evaluated = getattr(self, "_evaluated", 0) + 1
        if fired:
            self.run_actions(step)
            raise RuleEvaluationConditionMet(self.rule_name, step)

    def nothing_checked(self) -> str:
        """Why the rule judged nothing in the steps it was invoked at (no step, or none holding a tensor
        it needs); "" when it judged something. A rule that checked nothing did not pass: it has no
        data, which ``smdebug rules`` shows as such."""
        if getattr(self, "_evaluated", 0):
            return ""
        if getattr(self, "_skipped", 0):
            return f"nothing to check: the tensors it needs were saved at none of the {self._skipped} steps"
        return "nothing to check: no step was evaluated"

    def run_actions(self, step: int) -> None:
        """Take the actions of ``action_str`` for a firing: "stoptraining" leaves the stop signal in
        the base trial's folder, which the hook writing that run honours at its next step."""
        from smdebug.rules.actions import STOP_TRAINING, write_stop_signal

        if STOP_TRAINING in getattr(self, "_actions", ()):
            write_stop_signal(self.base_trial.path, self.rule_name, step, getattr(self, "reason", ""))

    # -- parsing of string parameters ---------------------------------------------------------------
    def parse_bool(self, name: str, value) -> bool:
        return params.to_bool(self.rule_name, name, value)

    def parse_float(self, name: str, value) -> float:
        return params.to_float(self.rule_name, name, value)

    def parse_int(self, name: str, value) -> int:
        return params.to_int(self.rule_name, name, value)

    @staticmethod
    def parse_list(value) -> list[str]:
        if value is None:
            return []
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return [str(v).strip() for v in value]


def nothing_checked(rule) -> str:
    """``rule.nothing_checked()`` for any rule object ("" for one that does not say)."""
    method = getattr(rule, "nothing_checked", None)
    return method() if callable(method) else ""
