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

The parts: ``rule_specs`` (what to evaluate), ``sweep_tasks`` (what a worker runs), ``sweep_executors``
(in this process or on Dask); this module splits the work and makes the table.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable

from smdebug.exceptions import SMDebugValueError
from smdebug.layout import WRITERS_DIR, find_runs, is_run  # noqa: F401 (run discovery, importable from here too)
from smdebug.rules.rule_specs import STEP_INDEPENDENT, RuleSpec, rule_specs  # noqa: F401 (and importable here)
from smdebug.rules.sweep_executors import (  # noqa: F401 (the CLI's and the bench's)
    DASK_HINT,
    DaskExecutor,
    SerialExecutor,
    _warm_up,
    connect,
    dask_available,
    default_workers,
    local_client,
)
from smdebug.rules.sweep_tasks import batches_of, evaluate_batch, evaluate_task, plan_run, tasks_of  # noqa: F401 (importable here)

logger = logging.getLogger("smdebug")

COLUMNS = ["run", "rule", "parameters", "status", "fired_steps", "tensors", "reason", "error", "note"]
STEPS_PER_TASK = 250


def evaluate_runs(runs, rules=None, **options):
    """Evaluate ``rules`` over every run of ``runs``; a pandas DataFrame with a row per (run, rule).

    - ``runs``: paths, URIs (``s3://...``, any fsspec URI), globs, folders holding runs, or Trials.
    - ``rules``: names (``"vanishing_gradient"``), ``rule_configs`` entries, Rule classes, or pairs of
      one of those and a dict of parameters; None: every built-in rule that needs no parameter.
    - ``client``: a ``dask.distributed.Client`` (or a scheduler's address) to run the tasks on;
      ``workers=N`` starts a LocalCluster of N processes for the call (without Dask installed: a
      one-line warning, and the tasks run in this process); neither: in this process. Trials given
      as runs are read again from their path where the tasks run.
    - Rules that compare runs (``other_trial(s)``) compare each run with ``baseline`` (a run or a list;
      default: the first run); the baseline's own row is skipped, except for a custom rule (its
      ``other_trials`` optional, as the walkthrough says), which judges the baseline without them.
    - ``start_step``/``end_step``: the steps start <= step < end; ``steps_per_task``: the size of a
      step range (default 250); ``timeout``: how long to wait for a new step of a live run (default:
      until it ends); ``stop_training``: the first rule firing on a live run leaves the stop signal.
    - ``progress(done, total)`` is called as tasks finish. A call that ends early (an error, Ctrl-C)
      cancels its tasks on the cluster, those following live runs included.
    (These options are keywords; ``evaluate_rows`` takes the same and needs no pandas.)

    Columns: run, rule, parameters (dict), status (fired, ok, no data: the rule had
    nothing to check, error, skipped), fired_steps (list),
    tensors (named in the reasons it fired), reason (of its first firing), error, note. A run that cannot
    be read has one row with rule None and status "error". Needs pandas.
    """
    from smdebug._optional import require

    pd = require("pandas", "evaluate_runs' results table")
    rows, skipped = evaluate_rows(runs, rules, **options)
    # object columns: a missing rule stays None, lists and dicts stay as they are
    df = pd.DataFrame(rows, columns=COLUMNS, dtype=object)
    df.attrs["skipped"] = skipped  # default rules that need parameters -> why
    return df


def evaluate_rows(
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
) -> tuple[list[dict], dict[str, str]]:
    """evaluate_runs' table without pandas (what ``smdebug rules`` prints), its options the same: the
    rows as dicts of the COLUMNS, and the default rules skipped as they need parameters (name -> why)."""
    paths = [r if isinstance(r, str) else _path_of(r) for r in find_runs(runs)]
    specs = rule_specs(rules, with_comparisons=rules is not None or len(paths) > 1)
    if baseline is None:
        baselines = paths[:1]
    else:
        given = baseline if isinstance(baseline, (list, tuple)) else [baseline]
        baselines = [_baseline(b if isinstance(b, str) else _path_of(b), paths) for b in given]
    for name, value in (("steps_per_task", steps_per_task), ("workers", workers)):
        if value is not None and value < 1:
            raise SMDebugValueError(f"{name} must be at least 1, got {value}")
    if end_step is not None and end_step <= start_step:
        raise SMDebugValueError(f"end_step {end_step} leaves no step to evaluate (start_step {start_step})")
    per_task = steps_per_task or STEPS_PER_TASK
    settings = dict(start_step=start_step, end_step=end_step, timeout=timeout, stop_training=stop_training)
    owned = None
    if client is None and workers is not None and workers > 1 and not dask_available():
        logger.warning("smdebug: Dask is not installed: evaluating the runs in this process (%s)", DASK_HINT)
    elif client is None and workers is not None and workers > 1:
        client, owned = local_client(workers)
    elif isinstance(client, str):
        client, owned = connect(client), True
    sweep_id = uuid.uuid4().hex
    try:
        executor = DaskExecutor(client) if client is not None else SerialExecutor()
        try:
            results = _run_tasks(executor, sweep_id, paths, specs, baselines, per_task, settings, progress)
        except BaseException:  # an error, or Ctrl-C: nothing of the sweep goes on without it
            try:
                executor.cancel(sweep_id)
            except Exception as exc:  # (a lost scheduler): the error that stopped the sweep matters more
                logger.warning("smdebug: the sweep's tasks could not be cancelled: %s", exc)
            raise
    finally:
        if owned:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None:
                cluster.close()
    skipped: dict[str, str] = {}
    return _rows(paths, specs, baselines, results, skipped), skipped


def _baseline(path: str, paths: list[str]) -> str:
    """The baseline as the sweep names it when it is one of the runs (however it was spelled: its own row
    is then skipped), else its path; an error when no run is there (nothing would be compared)."""
    from smdebug import plugins

    store = plugins.open_store(path)
    key = (store.fs.protocol, store.root)
    for run in paths:
        other = plugins.open_store(run)
        if (other.fs.protocol, other.root) == key:
            return run
    if not is_run(store) and not store.ask(store.fs.exists, f"{store.root}/{WRITERS_DIR}"):
        found = store.ask(store.fs.exists, store.root)
        raise SMDebugValueError(
            f"baseline {path}: {'no smdebug run found' if found else 'no such file or directory'}"
        )
    return path


def _path_of(trial) -> str:
    if isinstance(trial, os.PathLike):  # a pathlib.Path
        return os.fspath(trial)
    path = getattr(trial, "path", None)
    if not isinstance(path, str):
        raise SMDebugValueError(f"{trial!r} is neither a run's path nor a Trial")
    return path


def _run_tasks(executor, sweep_id, paths, specs, baselines, per_task, settings, progress) -> dict:
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
        new = evaluated if evaluated is not None else tasks_of(sweep_id, i, paths, plan, *job)
        tick(len(new))
        finished()
        if evaluated is not None:
            for key, result in evaluated:
                results[key] = result
                finished()
        else:
            executor.submit_tasks(batches_of(new), settings, finished)
    for key, result in executor.results(finished):
        results[key] = result
    return {"plans": plans, "tasks": results}


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
            damaged = sorted({s for chunk in chunks for s in chunk.get("damaged", ())})
            if damaged:  # the rule judged the run without these steps
                text = ", ".join(map(str, damaged[:6])) + (
                    f", ... ({len(damaged)} steps)" if damaged[6:] else ""
                )
                note = "; ".join(n for n in (note, f"damaged steps skipped: {text}") if n)
            if not (fired or error) and all(chunk.get("unmatched") for chunk in chunks):
                error = chunks[0]["unmatched"]  # a typo in the tensors to check: not "ok"
            status = "fired" if fired else "error" if error else "ok"
            if status == "ok" and all(chunk.get("nodata") for chunk in chunks):
                status, note = "no data", "; ".join(n for n in (chunks[0]["nodata"], note) if n)
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
