"""StalledTrainingRule: fires when a live run writes nothing new for ``threshold`` seconds."""

from __future__ import annotations

import time

from smdebug.exceptions import RuleEvaluationConditionMet, StepUnavailable
from smdebug.rules import params as p
from smdebug.rules.base import BuiltinRule
from smdebug.store import StoreUnavailableError


class StalledTrainingRule(BuiltinRule):
    """Waits for each step at most until ``threshold`` seconds have passed since the last new data (or the
    rule's start); fires when that time runs out. A finished run never stalls. With
    ``stop_training_on_fire`` it also leaves the stop signal that makes the running hook stop training."""

    name = "stalled_training_rule"
    reads_tensors = False  # it judges the time between steps

    def __init__(
        self, base_trial, threshold=1800, stop_training_on_fire=False, training_job_name_prefix=None
    ):
        super().__init__(base_trial)
        r = self.rule_name
        self.threshold = p.to_float(r, "threshold", threshold, low=0)
        self.stop_training_on_fire = p.to_bool(r, "stop_training_on_fire", stop_training_on_fire)
        self.training_job_name_prefix = training_job_name_prefix
        self._last_progress: float | None = None
        # a caller's own limit on one wait (``smdebug rules --watch --timeout``): TimeoutError past it
        self.max_wait: float | None = None

    def invoke(self, step):
        now = time.monotonic()
        if self._last_progress is None:
            self._last_progress = now
        remaining = max(self.threshold - (now - self._last_progress), 0.0)
        limit = remaining if self.max_wait is None else min(remaining, self.max_wait)
        try:
            self.base_trial.wait_for_steps([step], timeout=limit)
        except StoreUnavailableError:  # a store that stopped answering (a TimeoutError too) is no stall
            raise
        except TimeoutError:
            if limit < remaining:
                raise  # the caller's limit came first: no stall yet
            waited = time.monotonic() - self._last_progress
            self._last_progress = time.monotonic()  # fire once per stall period
            self.reason = f"no new data for {waited:.0f}s (threshold {self.threshold:g}s)"
            if self.stop_training_on_fire:
                from smdebug.rules.actions import write_stop_signal

                write_stop_signal(self.base_trial.path, self.rule_name, step, self.reason)
            else:
                self.run_actions(step)
            raise RuleEvaluationConditionMet(self.rule_name, step) from None
        except StepUnavailable:
            self._last_progress = time.monotonic()  # a later step arrived
            raise
        self._last_progress = time.monotonic()
        self._evaluated += 1
        if self.invoke_at_step(step):
            raise RuleEvaluationConditionMet(self.rule_name, step)

    def invoke_at_step(self, step):
        return False  # the step arrived in time
