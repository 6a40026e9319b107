"""invoke_rule: run a rule over the steps of its trial."""

from __future__ import annotations

import logging

from smdebug.exceptions import (
    NoMoreData,
    NoMoreProfilerData,
    RuleEvaluationConditionMet,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from smdebug.rules.rule import nothing_checked

logger = logging.getLogger("smdebug")


def invoke_rule(rule_obj, start_step: int = 0, end_step: int | None = None, raise_eval_cond: bool = False):
    """Invoke ``rule_obj`` at every step from start_step (to end_step, exclusive), as smdebug 1.0 does.

    Waits for the steps of a live run. With raise_eval_cond the first RuleEvaluationConditionMet is
    raised; otherwise evaluation goes on. Returns the steps at which the rule fired once end_step is
    reached; when the run has ended before that (end_step None or past its last step) NoMoreData is
    raised, as in smdebug 1.0, its ``fired_steps`` holding those steps (``evaluate_rule`` returns them
    instead).
    """
    name = type(rule_obj).__name__
    step = start_step or 0
    fired: list[int] = []
    logger.info("smdebug: started rule %s at step %d", name, step)
    trial = rule_obj.base_trial
    try:
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
            except NoMoreProfilerData as exc:  # smdebug 1.0's way for a rule to end its evaluation
                logger.info("smdebug: rule %s: %s", name, exc)
                break
            step = _next_step(trial, step)
    except NoMoreData as exc:
        logger.info("smdebug: rule %s reached the end of the run: %s", name, exc)
        exc.fired_steps = fired
        _warn_unmatched(rule_obj, fired)
        raise
    logger.info("smdebug: ended rule %s at step %d", name, step - 1)
    _warn_unmatched(rule_obj, fired)
    return fired


def evaluate_rule(rule_obj, start_step: int = 0, end_step: int | None = None) -> list[int]:
    """The steps from start_step (to end_step, exclusive, or the end of the run) at which ``rule_obj``
    fires: ``invoke_rule`` without the NoMoreData that ends it at the end of a finished run."""
    try:
        return invoke_rule(rule_obj, start_step, end_step)
    except NoMoreData as exc:
        return exc.fired_steps


def _warn_unmatched(rule_obj, fired: list[int]) -> None:
    """A rule that did not fire because it judged nothing says so: it did not pass."""
    if fired:
        return
    unmatched = getattr(rule_obj, "unmatched", None)
    if unmatched is not None and unmatched():
        logger.warning("smdebug: %s", unmatched())
    elif nothing_checked(rule_obj):
        logger.warning("smdebug: %s: %s", type(rule_obj).__name__, nothing_checked(rule_obj))


def _next_step(trial, step: int) -> int:
    """The next step to evaluate: skip straight to the next saved step once the run has ended."""
    if getattr(trial, "loaded_all_steps", False):
        later = [s for s in trial.steps(show_incomplete_steps=True) if s > step]
        if later:
            return later[0]
    return step + 1


def main(argv: list[str] | None = None) -> int:
    """``python -m smdebug.rules.rule_invoker --trial-dir DIR --rule-name NAME [--<param> VALUE ...]``,
    the command line older smdebug releases had; parameters not listed below go to the rule."""
    import argparse

    from smdebug.rules.builtin import create_rule
    from smdebug.trials import create_trial

    parser = argparse.ArgumentParser(prog="python -m smdebug.rules.rule_invoker")
    parser.add_argument("--trial-dir", required=True)
    parser.add_argument("--rule-name", required=True)
    parser.add_argument("--other-trials", default="", help="comma-separated paths of other runs")
    parser.add_argument("--start-step", type=int, default=0)
    parser.add_argument("--end-step", type=int, default=None)
    parser.add_argument("--raise-rule-eval-cond-exception", action="store_true")
    args, extra = parser.parse_known_args(argv)
    params = {}
    while extra:
        key = extra.pop(0)
        if not key.startswith("--") or not extra:
            parser.error(f"rule parameters go as --name value pairs, got {key!r}")
        params[key[2:].replace("-", "_")] = extra.pop(0)
    others = [create_trial(p.strip()) for p in args.other_trials.split(",") if p.strip()]
    rule = create_rule(args.rule_name, create_trial(args.trial_dir), other_trials=others, **params)
    if args.raise_rule_eval_cond_exception:  # a firing is raised; past that, the rule did not fire
        try:
            fired = invoke_rule(rule, args.start_step, args.end_step, raise_eval_cond=True)
        except NoMoreData:
            fired = []
    else:
        fired = evaluate_rule(rule, args.start_step, args.end_step)
    print(
        f"{type(rule).__name__}: fired at steps {fired}" if fired else f"{type(rule).__name__}: did not fire"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
