"""Rules over many runs: ``evaluate_runs(runs, rules)`` gives one pandas row per (run, rule).

The work is split into tasks of one rule over one run and one range of its steps, run in this process
or on a Dask cluster (``client=``, or ``workers=N`` for a LocalCluster; ``pip install
'smdebug-core[dask]'``). Both run the same task functions and merge their results the same way, so the
table does not depend on where the tasks ran. A run's tasks of one step range travel to Dask together
(one Dask task), preferably to the worker that first opened the run, which keeps it open.

A step range is a task of its own only for rules whose verdict at a step depends on the saved data alone
(``STEP_INDEPENDENT``, or a Rule class with ``step_independent = True``); rules that keep state from step
to step (losses, class counts, ...) take a run's steps in one task, in order. A run still being written
is followed until it ends (or until no new step comes for ``timeout`` seconds), as ``smdebug rules
--watch`` follows one run. A run that cannot be read gives one error row and the others go on.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from smdebug.exceptions import (
    NoMoreData,
    RuleEvaluationConditionMet,
    SMDebugError,
    SMDebugValueError,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from smdebug.layout import find_runs, is_run  # noqa: F401 (run discovery, importable from here too)

logger = logging.getLogger("smdebug")

COLUMNS = ["run", "rule", "parameters", "status", "fired_steps", "tensors", "reason", "error", "note"]
DASK_HINT = "pip install 'smdebug-core[dask]'"
STEPS_PER_TASK = 250
# Built-in rules whose verdict at a step reads only what the runs saved (no state kept between steps):
# any range of their steps can be evaluated on its own.
STEP_INDEPENDENT = frozenset(
    {
        "vanishing_gradient",
        "exploding_tensor",
        "all_zero",
        "unchanged_tensor",
        "tensor_variance",
        "similar_across_runs",
        "weight_update_ratio",
        "dead_relu",
        "saturated_activation",
        "confusion",
        "nlp_sequence_ratio",
    }
)
_SKIPPABLE = (TensorUnavailableForStep, TensorUnavailable, StepUnavailable, StepNotYetAvailable)
_COMPARE_PARAMS = ("other_trials", "other_trial")


# -- what to evaluate ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RuleSpec:
    """One rule to evaluate on every run: a built-in rule's name or configuration, or a Rule class."""

    target: object  # a name (str), a rule_configs dict, or a Rule subclass
    params: tuple = ()  # (key, value) pairs
    label: str = ""
    step_independent: bool = False
    compares: bool = False  # takes other_trial(s) and none was given: compared with the baseline runs
    optional: bool = False  # from the default set: skipped (not an error) when it needs parameters

    def build(self, trial, other_trials=()):
        from smdebug.rules.builtin import create_rule

        params = dict(self.params)
        others = list(other_trials) if self.compares else None
        if isinstance(self.target, type):
            accepted = _parameters(self.target)
            if others:
                if "other_trials" in accepted:
                    params.setdefault("other_trials", others)
                elif "other_trial" in accepted:
                    params.setdefault("other_trial", others[0])
            return self.target(trial, **params)
        return create_rule(self.target, trial, other_trials=others, **params)


def _parameters(cls) -> set[str]:
    return set(list(inspect.signature(cls.__init__).parameters)[2:])


def rule_specs(rules=None, *, with_comparisons: bool = True) -> list[RuleSpec]:
    """RuleSpecs from names (``"vanishing_gradient"``), ``rule_configs`` entries, Rule classes, or pairs
    of one of those and its parameters (``("loss_not_decreasing", {"num_steps": 5})``). None: every
    built-in rule (those needing parameters are then skipped)."""
    from smdebug.rules.builtin import builtin_rules, find_rule
    from smdebug.rules.rule import Rule

    optional = rules is None
    if rules is None:
        found = builtin_rules().items()
        rules = [n for n, cls in found if with_comparisons or not _parameters(cls) & set(_COMPARE_PARAMS)]
    elif isinstance(rules, (str, dict, type)):
        rules = [rules]
    specs = []
    for item in rules:
        params: dict = {}
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], dict):
                raise SMDebugValueError(f"rule {item!r}: expected (rule, {{parameter: value}})")
            item, params = item
        if isinstance(item, type):
            if not issubclass(item, Rule):
                raise SMDebugValueError(f"{item.__name__} is not a Rule subclass")
            cls, label = item, getattr(item, "name", "") or item.__name__
        elif isinstance(item, dict):
            section = item.get("DebugRuleConfiguration", item)
            given = section.get("RuleParameters") or {}
            cls = find_rule(given.get("rule_to_invoke") or section.get("RuleConfigurationName"))
            label = getattr(cls, "name", "") or cls.__name__
            params = {**{k: v for k, v in given.items() if k != "rule_to_invoke"}, **params}
        elif isinstance(item, str):
            cls = find_rule(item)
            label = getattr(cls, "name", "") or cls.__name__
        else:
            raise SMDebugValueError(f"{item!r} is not a rule (a name, a rule_configs entry or a Rule class)")
        target = item if isinstance(item, type) else label if not isinstance(item, dict) else item
        independent = getattr(cls, "step_independent", None)
        if independent is None:
            independent = getattr(cls, "name", None) in STEP_INDEPENDENT and cls.__module__.startswith(
                "smdebug."
            )
        compares = bool(_parameters(cls) & set(_COMPARE_PARAMS)) and not (set(params) & set(_COMPARE_PARAMS))
        specs.append(
            RuleSpec(
                target=target,
                params=tuple(sorted(params.items())),
                label=label,
                step_independent=bool(independent),
                compares=compares,
                optional=optional,
            )
        )
    return specs


# -- tasks (run in this process or on Dask workers) ---------------------------------------------------------
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
            if not trial.store.fs.exists(trial.store.root):
                return {"error": f"{path}: no such file or directory"}
            return {"error": f"{path}: no smdebug run found (no index or collections files)"}
        ended = trial.loaded_all_steps
        if not ended:
            _local.trials.pop((sweep_id, path), None)  # followed by each task with its own trial
        return {"steps": steps, "ended": ended, "name": trial.name, "worker": _worker_address()}
    except Exception as exc:  # a damaged or unreadable run is one error row
        return {"error": _describe(exc)}


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
    out = _error_result("")
    live = steps is None
    try:
        trial = _trial(sweep_id, path, live=live)
        other_trials = [_trial(sweep_id, o, live=live) for o in others]
        rule = spec.build(trial, other_trials)
    except Exception as exc:
        if spec.optional and isinstance(exc, (SMDebugError, TypeError, ValueError)):
            out["skipped"] = f"needs parameters: {exc}"
        else:
            out["error"] = _describe(exc)
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
            _evaluate(rule, invoke, live, steps, trial, start_step, end_step, timeout, out)
    except NoMoreData:
        pass
    except Exception as exc:  # one broken rule does not stop the others
        out["error"] = _describe(exc)
    unmatched = getattr(rule, "unmatched", None)
    if unmatched is not None:
        out["unmatched"] = unmatched()  # the user's choice of tensors matched none in these steps
    return out


def _evaluate(rule, invoke, live, steps, trial, start_step, end_step, timeout, out) -> None:
    if live:
        _follow(trial, rule, invoke, start_step, end_step, timeout, out)
        return
    for step in steps:
        if not invoke(step):
            out["ended"] = True
            return


def _follow(trial, rule, invoke, start_step, end_step, timeout, out) -> None:
    from smdebug.rules.stalled import StalledTrainingRule

    stalled = isinstance(rule, StalledTrainingRule)
    trial.refresh_interval = 0.2
    step = start_step
    while end_step is None or step < end_step:
        try:
            if stalled and not invoke(step):  # it waits for the step itself, with its own time limit
                return
            trial.wait_for_steps([step], timeout=timeout)
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


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, SMDebugError) else f"{type(exc).__name__}: {text}"


# -- running the tasks ----------------------------------------------------------------------------------
@dataclass
class _Run:
    index: int
    path: str
    plan: dict = field(default_factory=dict)


def evaluate_runs(
    runs,
    rules=None,
    *,
    client=None,
    workers: int | None = None,
    baseline=None,
    start_step: int = 0,
    end_step: int | None = None,
    steps_per_task: int | None = None,
    timeout: float | None = None,
    stop_training: bool = False,
    progress: Callable[[int, int], None] | None = None,
):
    """Evaluate ``rules`` over every run of ``runs``; a pandas DataFrame with a row per (run, rule).

    - ``runs``: paths, URIs (``s3://...``, any fsspec URI), globs, folders holding runs, or Trials.
    - ``rules``: names (``"vanishing_gradient"``), ``rule_configs`` entries, Rule classes, or pairs of
      one of those and a dict of parameters; None: every built-in rule that needs no parameter.
    - ``client``: a ``dask.distributed.Client`` (or a scheduler's address) to run the tasks on;
      ``workers=N`` starts a LocalCluster of N processes for the call (without Dask installed: a
      one-line warning, and the tasks run in this process); neither: in this process. Trials given
      as runs are read again from their path where the tasks run.
    - Rules that compare runs (``other_trial(s)``) compare each run with ``baseline`` (a run or a list;
      default: the first run); the baseline's own row is skipped.
    - ``start_step``/``end_step``: the steps start <= step < end; ``steps_per_task``: the size of a
      step range (default 250); ``timeout``: how long to wait for a new step of a live run (default:
      until it ends); ``stop_training``: the first rule firing on a live run leaves the stop signal.
    - ``progress(done, total)`` is called as tasks finish.

    Columns: run, rule, parameters (dict), status (fired, ok, error, skipped), fired_steps (list),
    tensors (named in the reasons it fired), reason (of its first firing), error, note. A run that cannot
    be read has one row with rule None and status "error". Needs pandas.
    """
    from smdebug._optional import require

    pd = require("pandas", "evaluate_runs' results table")
    paths = [r if isinstance(r, str) else _path_of(r) for r in find_runs(runs)]
    specs = rule_specs(rules, with_comparisons=rules is not None or len(paths) > 1)
    if baseline is None:
        baselines = paths[:1]
    else:
        given = baseline if isinstance(baseline, (list, tuple)) else [baseline]
        baselines = [b if isinstance(b, str) else _path_of(b) for b in given]
    per_task = steps_per_task or STEPS_PER_TASK
    settings = dict(start_step=start_step, end_step=end_step, timeout=timeout, stop_training=stop_training)
    owned = None
    if client is None and workers is not None and workers > 1 and not dask_available():
        logger.warning("smdebug: Dask is not installed: evaluating the runs in this process (%s)", DASK_HINT)
    elif client is None and workers is not None and workers > 1:
        client, owned = local_client(workers)
    elif isinstance(client, str):
        client, owned = connect(client), True
    try:
        executor = _DaskExecutor(client) if client is not None else _SerialExecutor()
        results = _run_tasks(executor, paths, specs, baselines, per_task, settings, progress)
    finally:
        if owned:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None:
                cluster.close()
    skipped: dict[str, str] = {}
    # object columns: a missing rule stays None, lists and dicts stay as they are
    df = pd.DataFrame(_rows(paths, specs, baselines, results, skipped), columns=COLUMNS, dtype=object)
    df.attrs["skipped"] = skipped  # default rules that need parameters -> why
    return df


def _path_of(trial) -> str:
    path = getattr(trial, "path", None)
    if not isinstance(path, str):
        raise SMDebugValueError(f"{trial!r} is neither a run's path nor a Trial")
    return path


def _chunks(steps: list[int], size: int) -> list[list[int]]:
    return [steps[i : i + size] for i in range(0, len(steps), size)] or [[]]


def _tasks_of(sweep_id: str, i: int, paths: list, plan: dict, specs, baselines, per_task, settings) -> list:
    """The (key, arguments, (run index, worker)) of run i's tasks: one per (rule, step range)."""
    if "error" in plan:
        return []
    start, end = settings["start_step"], settings["end_step"]
    steps = [s for s in plan["steps"] if s >= start and (end is None or s < end)]
    tasks = []
    for j, spec in enumerate(specs):
        others = tuple(b for b in baselines if b != paths[i]) if spec.compares else ()
        if spec.compares and not others:
            continue  # the baseline itself
        if not plan["ended"]:
            chunks = [None]
        elif spec.step_independent:
            chunks = _chunks(steps, per_task)
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
        batches = _batches(_tasks_of(sweep_id, i, paths, plan, specs, baselines, per_task, settings))
        if len(batches) == 1:
            plan["done"] = evaluate_batch(batches[0][0], **settings)
    return plan


def _run_tasks(executor, paths, specs, baselines, per_task, settings, progress) -> dict:
    sweep_id = uuid.uuid4().hex
    job = (specs, baselines, per_task, settings)
    plans: dict[int, dict] = {}
    results: dict[tuple, dict] = {}
    total = len(paths)
    done = 0

    def tick(n_new_total: int = 0) -> None:
        nonlocal done, total
        total += n_new_total
        if progress is not None:
            progress(done, total)

    def finished() -> None:
        nonlocal done
        done += 1
        tick()

    tick()
    for i, plan in executor.map_plans(sweep_id, paths, job):
        evaluated = plan.pop("done", None)  # the run's tasks, already evaluated where it was planned
        plans[i] = plan
        new = evaluated if evaluated is not None else _tasks_of(sweep_id, i, paths, plan, *job)
        tick(len(new))
        finished()
        if evaluated is not None:
            for key, result in evaluated:
                results[key] = result
                finished()
        else:
            executor.submit_tasks(_batches(new), settings, finished)
    for key, result in executor.results(finished):
        results[key] = result
    return {"plans": plans, "tasks": results}


def _batches(tasks: list) -> list:
    """A run's (rule, step range) tasks, sent as one Dask task per step range (a live run's: one each):
    scheduling costs milliseconds a task, as much as a rule over a short range of steps."""
    groups: dict = {}
    for key, args, meta in tasks:
        group = key[2] if args[-1] is not None else key
        groups.setdefault(group, ([], meta))[0].append((key, args))
    return list(groups.values())


def evaluate_batch(items: list, **settings) -> list:
    """evaluate_task for each (key, arguments) of items, in order: [(key, result), ...]."""
    return [(key, evaluate_task(*args, **settings)) for key, args in items]


def _error_result(error: str) -> dict:
    return {
        "fired": [],
        "reason": "",
        "tensors": [],
        "error": error,
        "note": "",
        "ended": False,
        "skipped": "",
    }


class _SerialExecutor:
    """A run's tasks right after its plan, while its trial is at hand."""

    def __init__(self):
        self._done = []

    def map_plans(self, sweep_id, paths, job):
        for i, path in enumerate(paths):
            yield i, plan_run(sweep_id, path)

    def submit_tasks(self, batches, settings, finished):
        for items, _ in batches:
            for key, result in evaluate_batch(items, **settings):
                self._done.append((key, result))
                finished()

    def results(self, finished):
        yield from self._done
        self._done.clear()
        _local.trials = OrderedDict()


class _DaskExecutor:
    """Each run's rule tasks are submitted as soon as its plan is known, with the plan's priority: the
    workers go through the runs roughly in order, a run's tasks before the next plans, so that the
    trials a worker keeps are those its next tasks read."""

    def __init__(self, client):
        self.client = client
        self.futures = {}

    def map_plans(self, sweep_id, paths, job):
        from distributed import as_completed

        futures = {
            self.client.submit(plan_and_evaluate, sweep_id, i, paths, job, pure=False, priority=-i): i
            for i in range(len(paths))
        }
        for future in as_completed(futures):
            i = futures[future]
            try:
                plan = future.result()
            except Exception as exc:  # e.g. the worker died more often than Dask retries
                plan = {"error": _describe(exc)}
            yield i, plan

    def submit_tasks(self, batches, settings, finished):
        for items, (run_index, worker) in batches:
            # preferably where the plan ran, which has the trial open (any worker when that one is busy)
            where = dict(workers=[worker], allow_other_workers=True) if worker else {}
            future = self.client.submit(
                evaluate_batch, items, **settings, pure=False, priority=-run_index, **where
            )
            self.futures[future] = [key for key, _ in items]

    def results(self, finished):
        from distributed import as_completed

        for future in as_completed(list(self.futures)):
            keys = self.futures.pop(future)
            try:
                done = future.result()
            except Exception as exc:  # e.g. lost with its worker more often than Dask retries
                done = [(key, _error_result(_describe(exc))) for key in keys]
            for key, result in done:
                finished()
                yield key, result


def _rows(paths, specs, baselines, results, skipped_rules: dict) -> list[dict]:
    plans, tasks = results["plans"], results["tasks"]
    rows = []
    for i, path in enumerate(paths):
        plan = plans.get(i, {"error": "not evaluated"})
        if "error" in plan:
            rows.append(_row(path, None, {}, "error", error=plan["error"]))
            continue
        for j, spec in enumerate(specs):
            chunks = [tasks[key] for key in sorted(k for k in tasks if k[:2] == (i, j))]
            params = dict(spec.params)
            if not chunks:
                if spec.compares:
                    rows.append(
                        _row(path, spec.label, params, "skipped", note="the baseline of the comparison")
                    )
                continue
            fired, tensors, reason, error, note, skipped = [], set(), "", "", "", ""
            for chunk in chunks:  # in step order, as one task over all the steps would have gone
                fired += chunk["fired"]
                tensors |= set(chunk["tensors"])
                reason = reason or chunk["reason"]
                note = note or chunk["note"]
                skipped = skipped or chunk.get("skipped", "")
                if chunk["error"] or skipped:
                    error = chunk["error"]
                    break
                if chunk["ended"]:
                    break
            if skipped:  # a default rule that needs parameters: said once, not per run
                skipped_rules.setdefault(spec.label, skipped)
                continue
            if not (fired or error) and all(chunk.get("unmatched") for chunk in chunks):
                error = chunks[0]["unmatched"]  # a typo in the tensors to check: not "ok"
            status = "fired" if fired else "error" if error else "ok"
            rows.append(_row(path, spec.label, params, status, fired, sorted(tensors), reason, error, note))
    return rows


def _row(run, rule, params, status, fired=(), tensors=(), reason="", error="", note="") -> dict:
    return dict(
        run=run,
        rule=rule,
        parameters=params,
        status=status,
        fired_steps=list(fired),
        tensors=list(tensors),
        reason=reason,
        error=error,
        note=note,
    )


# -- Dask clients -----------------------------------------------------------------------------------------
def dask_available() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def local_client(workers: int):
    """A Client of a LocalCluster of ``workers`` single-threaded processes (closed with the client)."""
    from smdebug._optional import MissingDependencyError

    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError:
        raise MissingDependencyError(f"parallel workers need dask.distributed: {DASK_HINT}") from None
    # The workers' statistical profiler samples the running task's Python stack every 10 ms: rules are
    # Python-heavy and run several times slower under it.
    with dask.config.set({"distributed.worker.profile.enabled": False}):
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
    client = Client(cluster)
    client.run(_warm_up)  # the workers' imports happen while the cluster starts, not in their first tasks
    return client, True


def _warm_up() -> None:
    """Import what a task needs (trials, the built-in rules, the plugins) in this process."""
    from smdebug.rules.builtin import builtin_rules
    from smdebug.trials import create_trial  # noqa: F401

    builtin_rules()  # loads the plugins, which may add rules


def connect(address: str, timeout: float = 20):
    """A Client of the Dask scheduler at address (``tcp://host:8786``)."""
    from smdebug._optional import MissingDependencyError

    try:
        from distributed import Client
    except ImportError:
        raise MissingDependencyError(f"--scheduler needs dask.distributed: {DASK_HINT}") from None
    try:
        return Client(address, timeout=timeout)
    except OSError as exc:
        raise SMDebugValueError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


def default_workers() -> int:
    return max(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 1)
