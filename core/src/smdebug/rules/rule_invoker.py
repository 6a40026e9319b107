"""invoke_rule: run a rule over the steps of its trial."""

from __future__ import annotations

import logging

from smdebug.exceptions import (
    NoMoreData,
    RuleEvaluationConditionMet,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)

logger = logging.getLogger("smdebug")


def invoke_rule(rule_obj, start_step: int = 0, end_step: int | None = None, raise_eval_cond: bool = False):
    """Invoke ``rule_obj`` at every step from start_step (to end_step, exclusive).

    Waits for steps of a live run; ends cleanly at the end of a finished run. With raise_eval_cond the
    first RuleEvaluationConditionMet is raised; otherwise evaluation goes on and the steps at which the
    rule fired are returned.
    """
    name = type(rule_obj).__name__
    step = start_step or 0
    fired: list[int] = []
    logger.info("smdebug: started rule %s at step %d", name, step)
    trial = rule_obj.base_trial
    while end_step is None or step < end_step:
        try:
            rule_obj.invoke(step)
        except (TensorUnavailableForStep, StepUnavailable, TensorUnavailable) as exc:
            logger.debug("%s", exc)
        except RuleEvaluationConditionMet as exc:
            if raise_eval_cond:
                raise
            logger.info("%s", exc)
            fired.append(step)
            if exc.end_of_rule:
                break
        except NoMoreData as exc:
            logger.info("smdebug: rule %s reached the end of the run: %s", name, exc)
            break
        step = _next_step(trial, step)
    logger.info("smdebug: ended rule %s at step %d", name, step - 1)
    return fired


def _next_step(trial, step: int) -> int:
    """The next step to evaluate: skip straight to the next saved step once the run has ended."""
    if getattr(trial, "loaded_all_steps", False):
        later = [s for s in trial.steps(show_incomplete_steps=True) if s > step]
        if later:
            return later[0]
    return step + 1
