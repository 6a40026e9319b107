"""The tasks of a sweep (smdebug.rules.sweep), run in this process or on Dask workers: a run's plan (its
steps, whether it ended), and one rule over one run and a range of its steps, following a live run; a
run's tasks batched by step range. Each worker thread keeps the trials its tasks opened."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import numpy as np

from smdebug.exceptions import (
    NoMoreData,
    RuleEvaluationConditionMet,
    SMDebugError,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from smdebug.layout import no_run_here
from smdebug.rules.rule import nothing_checked
from smdebug.rules.rule_specs import RuleSpec

_SKIPPABLE = (TensorUnavailableForStep, TensorUnavailable, StepUnavailable, StepNotYetAvailable)
_CACHE_SIZE = 16
_local = threading.local()


def _trial(sweep_id: str, path: str, live: bool = False):
    """The trial at path, kept per thread for the tasks of one sweep over a finished run."""
    from smdebug.trials import create_trial

    if live:
        return create_trial(path, missing_ok=True)  # a run not there is an error row
    cache = getattr(_local, "trials", None)
    if cache is None:
        cache = _local.trials = OrderedDict()
    key = (sweep_id, path)
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    trial = create_trial(path, missing_ok=True)
    cache[key] = trial
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return trial


def plan_run(sweep_id: str, path: str) -> dict:
    """What a run holds: its saved steps, whether it has ended; an error when it cannot be read."""
    try:
        trial = _trial(sweep_id, path)
        steps = trial.steps()
        if not steps and not trial.collections() and not trial.steps(show_incomplete_steps=True):
            return {"error": no_run_here(trial.store, path)}
        ended = trial.loaded_all_steps
        if not ended:
            _local.trials.pop((sweep_id, path), None)  # followed by each task with its own trial
        return {"steps": steps, "ended": ended, "name": trial.name, "worker": _worker_address()}
    except Exception as exc:  # a damaged or unreadable run is one error row
        return {"error": describe_error(exc)}


def evaluate_task(
    sweep_id: str,
    path: str,
    spec: RuleSpec,
    others: tuple,
    steps: list | None,
    start_step: int = 0,
    end_step: int | None = None,
    timeout: float | None = None,
    stop_training: bool = False,
) -> dict:
    """One rule over one run: at ``steps`` (a finished run), or following a live run (``steps=None``)."""
    out = error_result("")
    live = steps is None
    try:
        trial = _trial(sweep_id, path, live=live)
        other_trials = [_trial(sweep_id, o, live=live) for o in others]
        rule = spec.build(trial, other_trials)
    except Exception as exc:
        if spec.optional and isinstance(exc, (SMDebugError, TypeError, ValueError)):
            out["skipped"] = f"needs parameters: {exc}"
        else:
            out["error"] = describe_error(exc)
        return out
    names = None

    def fired(step: int) -> None:
        nonlocal names
        out["fired"].append(step)
        reason = getattr(rule, "reason", "") or ""
        if not out["reason"]:
            out["reason"] = reason
        if reason:
            if names is None:
                names = sorted({n for t in [trial, *other_trials] for n in t.tensor_names()}, key=len)
            hits = [n for n in names if n in reason]
            hits = [n for n in hits if not any(n != m and n in m for m in hits)]
            out["tensors"] = sorted(set(out["tensors"]) | set(hits))
        if stop_training and live and len(out["fired"]) == 1:
            from smdebug.rules.actions import write_stop_signal

            write_stop_signal(trial.store, rule.rule_name, step, reason)

    def invoke(step: int) -> bool:
        """False when the rule is done with the run (it ended, or asked to stop)."""
        try:
            rule.invoke(step)
        except RuleEvaluationConditionMet as exc:
            fired(step)
            return not getattr(exc, "end_of_rule", False)
        except _SKIPPABLE:
            pass
        except NoMoreData:
            if live:
                raise  # the run has ended
        return True

    try:
        with np.errstate(all="ignore"):  # a run's NaNs are what rules look for, not a warning
            cancelled = _cancel_check(sweep_id) if live else None
            _evaluate(rule, invoke, live, steps, trial, start_step, end_step, timeout, out, cancelled)
    except NoMoreData:
        pass
    except Exception as exc:  # one broken rule does not stop the others
        out["error"] = describe_error(exc)
    # steps of the range that are damaged (a malformed index, a record the rule could not read) were
    # skipped: the row says so, as the run's reader logs it only where the task ran
    out["damaged"] = [
        s
        for s in _damaged_steps(trial, other_trials)
        if s >= start_step and (end_step is None or s < end_step)
    ]
    unmatched = getattr(rule, "unmatched", None)
    if unmatched is not None:
        out["unmatched"] = unmatched()  # the user's choice of tensors matched none in these steps
    out["nodata"] = nothing_checked(rule)  # no step, no tensor it reads: the rule judged nothing here
    return out


def _damaged_steps(trial, other_trials) -> set:
    try:
        return {s for t in [trial, *other_trials] for s in t.corrupt_steps()}
    except Exception:  # the record of damage is not worth failing the row for
        return set()


def _evaluate(rule, invoke, live, steps, trial, start_step, end_step, timeout, out, cancelled) -> None:
    if live:
        _follow(trial, rule, invoke, start_step, end_step, timeout, out, cancelled)
        return
    for step in steps:
        if not invoke(step):
            out["ended"] = True
            return


CANCEL_CHECK_SECONDS = 2.0  # how often a Dask task following a live run asks whether its sweep was cancelled


def cancel_event_name(sweep_id: str) -> str:
    """The Dask Event a cancelled sweep sets, so that its tasks following live runs end."""
    return f"smdebug-sweep-cancelled-{sweep_id}"


def _cancel_check(sweep_id: str):
    """On a Dask worker, a function saying whether the sweep was cancelled; None elsewhere (a sweep in
    this process ends with its caller)."""
    try:
        from distributed import Event, get_worker

        get_worker()
    except (ImportError, ValueError):
        return None
    return Event(cancel_event_name(sweep_id)).is_set


def _wait_for_step(trial, step: int, timeout: float | None, cancelled) -> bool:
    """trial.wait_for_steps([step], timeout=timeout), asking ``cancelled()`` (when given) every
    CANCEL_CHECK_SECONDS; False when the sweep was cancelled meanwhile."""
    if cancelled is None:
        trial.wait_for_steps([step], timeout=timeout)
        return True
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = CANCEL_CHECK_SECONDS if deadline is None else max(deadline - time.monotonic(), 0)
        try:
            trial.wait_for_steps([step], timeout=min(left, CANCEL_CHECK_SECONDS))
            return True
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise
        if cancelled():  # asked only while waiting: a step already there costs no round trip
            return False


def _follow(trial, rule, invoke, start_step, end_step, timeout, out, cancelled) -> None:
    from smdebug.rules.stalled import StalledTrainingRule

    stalled = isinstance(rule, StalledTrainingRule)
    if stalled:  # it waits for each step up to its threshold: the timeout is the limit of one wait
        rule.max_wait = timeout
    trial.refresh_interval = 0.2
    step = start_step
    while end_step is None or step < end_step:
        try:
            if stalled and not invoke(step):  # it waits for the step itself, with its own time limit
                return
            if not _wait_for_step(trial, step, timeout, cancelled):
                out["note"] = "the sweep was cancelled"
                return
            if not stalled and not invoke(step):
                return
        except StepUnavailable:
            pass  # not saved: a later step exists
        except NoMoreData:
            return
        except TimeoutError:
            out["note"] = f"stopped following the run: no new step for {timeout:g}s"
            return
        later = [s for s in trial.steps(show_incomplete_steps=True) if s > step]
        step = later[0] if later else step + 1
    if not trial.training_ended():
        out["note"] = f"the run was still going: evaluated up to step {end_step}"


def _worker_address() -> str | None:
    """The Dask worker running this task (None outside one)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


def describe_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, SMDebugError) else f"{type(exc).__name__}: {text}"


def evaluate_batch(items: list, **settings) -> list:
    """evaluate_task for each (key, arguments) of items, in order: [(key, result), ...]."""
    return [(key, evaluate_task(*args, **settings)) for key, args in items]


def error_result(error: str) -> dict:
    return {
        "fired": [],
        "reason": "",
        "tensors": [],
        "error": error,
        "note": "",
        "damaged": [],
        "ended": False,
        "skipped": "",
    }


def step_chunks(steps: list[int], size: int) -> list[list[int]]:
    return [steps[i : i + size] for i in range(0, len(steps), size)] or [[]]


def tasks_of(sweep_id: str, i: int, paths: list, plan: dict, specs, baselines, per_task, settings) -> list:
    """The (key, arguments, (run index, worker)) of run i's tasks: one per (rule, step range)."""
    if "error" in plan:
        return []
    start, end = settings["start_step"], settings["end_step"]
    steps = [s for s in plan["steps"] if s >= start and (end is None or s < end)]
    tasks = []
    for j, spec in enumerate(specs):
        others = tuple(b for b in baselines if b != paths[i]) if spec.compares else ()
        if spec.compares and not others and not spec.baseline_too:
            continue  # the baseline itself
        if not plan["ended"]:
            chunks = [None]
        elif spec.step_independent:
            chunks = step_chunks(steps, per_task)
        else:
            chunks = [steps]
        for k, chunk in enumerate(chunks):
            tasks.append(((i, j, k), (sweep_id, paths[i], spec, others, chunk), (i, plan.get("worker"))))
    return tasks


def plan_and_evaluate(sweep_id: str, i: int, paths: list, job: tuple) -> dict:
    """plan_run of run i, and when its tasks make one batch (a finished run of at most steps_per_task
    steps) their results too, under "done": one Dask task for such a run instead of two."""
    specs, baselines, per_task, settings = job
    plan = plan_run(sweep_id, paths[i])
    if plan.get("ended"):
        batches = batches_of(tasks_of(sweep_id, i, paths, plan, specs, baselines, per_task, settings))
        if len(batches) == 1:
            plan["done"] = evaluate_batch(batches[0][0], **settings)
    return plan


def batches_of(tasks: list) -> list:
    """A run's (rule, step range) tasks, sent as one Dask task per step range (a live run's: one each):
    scheduling costs milliseconds a task, as much as a rule over a short range of steps."""
    groups: dict = {}
    for key, args, meta in tasks:
        group = key[2] if args[-1] is not None else key
        groups.setdefault(group, ([], meta))[0].append((key, args))
    return list(groups.values())


def forget_trials() -> None:
    """Drop this thread's kept trials (a sweep in this process is over)."""
    _local.trials = OrderedDict()
