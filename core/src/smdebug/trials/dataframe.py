"""A saved run as a pandas DataFrame (pandas is optional: ``pip install pandas``)."""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

from smdebug._optional import require
from smdebug.exceptions import CorruptTensorRecord, SMDebugValueError, TensorUnavailableForStep, did_you_mean
from smdebug.layout import worker_from_file_name
from smdebug.modes import ModeKeys, to_mode
from smdebug.reductions import ALLOWED_NORMS, ALLOWED_REDUCTIONS, numpy_reduction
from smdebug.trials.tensor import Tensor
from smdebug.trials.trial import Trial, create_trial

COLUMNS = ["tensor", "step", "mode", "mode_step", "worker", "value"]


def to_dataframe(
    source: Trial | Tensor | str,
    tensor_names: Iterable[str] | str | None = None,
    *,
    collection: str | None = None,
    regex: Iterable[str] | str | None = None,
    mode=None,
    steps: Iterable[int] | None = None,
    worker: str | None = None,
    reductions: Iterable[str] | None = None,
    values: bool = True,
    dask: bool = False,
):
    """A tidy pandas DataFrame of saved tensors: one row per tensor, saved step and worker.

    ``source`` is a Trial, a run's path (opened with ``create_trial``) or one Tensor of a trial.
    Which tensors: ``tensor_names`` (a name or a list), else those of ``collection`` and/or matching
    ``regex`` (as ``trial.tensor_names``), else every tensor. ``mode`` (a ModeKeys or its name) keeps
    one mode's steps; ``steps`` keeps some of them (mode steps when ``mode`` is given, else global
    steps); ``worker`` keeps one worker's rows (default: every worker).

    Columns, in order:

    - ``tensor`` (str), ``step`` (global step, int), ``mode`` (mode name, e.g. "TRAIN"),
      ``mode_step`` (int), ``worker`` (str);
    - ``value`` (with ``values=True``): a float for a one-element tensor, the numpy array otherwise,
      None when only reductions of the tensor were saved at that step;
    - one column per reduction: those named in ``reductions`` (e.g. ``["mean", "abs_max", "l2"]``;
      taken from the saved reductions, else computed from the saved value, NaN when neither exists),
      or, when ``reductions`` is None, every reduction that was saved for the selected tensors.

    Rows are sorted by tensor then step. For one column per tensor, pivot it::

        df = to_dataframe(trial, collection="losses", mode="TRAIN")
        wide = df.pivot_table(index="step", columns="tensor", values="value")

    Many runs: ``source`` a list of runs (paths or Trials), a glob (``"sweep/lr-*"``) or a folder (or
    s3:// prefix) holding runs gives one frame with a first column ``run`` (the run's path). With
    ``dask=True`` (``pip install 'smdebug-core[dask]'``) the result is a lazy Dask DataFrame with one
    partition per run, so reductions across a sweep run on a Dask cluster; its columns are those of the
    first run's frame (pass ``reductions`` to fix them).

    Raises MissingDependencyError (an ImportError) when pandas (or, with ``dask=True``, Dask) is not
    installed.
    """
    pd = require("pandas", "smdebug's DataFrame export")
    if isinstance(source, os.PathLike):  # a pathlib.Path, as create_trial takes
        source = os.fspath(source)
    options = dict(
        tensor_names=tensor_names,
        collection=collection,
        regex=regex,
        mode=mode,
        steps=steps,
        worker=worker,
        reductions=reductions,
        values=values,
    )
    from smdebug.layout import find_runs

    many = isinstance(source, (list, tuple)) or (isinstance(source, str) and any(c in source for c in "*?["))
    runs = None
    if isinstance(source, str) and not (dask or many):
        try:  # a folder (or prefix) holding runs rather than being one
            runs = find_runs(source)
        except SMDebugValueError:  # nothing there yet: a run about to be written, read as one
            pass
        many = runs is not None and runs != [source.rstrip("/") or "/"]
    if dask or many:
        runs = runs or find_runs(source)
        if dask:
            return _dask_frame(runs, options)
        return pd.concat([_run_frame(run, options) for run in runs], ignore_index=True)
    return _frame(source, **options, strict=True)


def _frame(source, *, tensor_names, collection, regex, mode, steps, worker, reductions, values, strict: bool):
    """to_dataframe of one run (a Trial, its path or a Tensor). ``strict``: a collection the run has not is
    an error naming the nearest (a typo gave an empty frame); a sweep's runs, which need not all have
    it, are not strict. (A worker the run has not gives no rows.)"""
    pd = require("pandas", "smdebug's DataFrame export")
    if isinstance(source, str):
        source = create_trial(source)
    trial = source.trial if isinstance(source, Tensor) else source
    if strict:
        _check(trial, collection)
    if worker is not None:  # (a TensorFlow device also in its file-name form)
        worker = worker_from_file_name(str(worker))
    if isinstance(source, Tensor):
        tensors = [source]
    else:
        if isinstance(tensor_names, str):
            tensor_names = [tensor_names]
        if tensor_names is None and collection is not None and regex is not None:
            in_collection = set(trial.tensor_names(collection=collection))
            tensor_names = [n for n in trial.tensor_names(regex=regex) if n in in_collection]
        elif tensor_names is None:
            tensor_names = trial.tensor_names(collection=collection, regex=regex)
        tensors = [trial.tensor(name) for name in tensor_names]
    mode = None if mode is None or to_mode(mode) == ModeKeys.GLOBAL else to_mode(mode)
    wanted_steps = None if steps is None else {int(s) for s in steps}
    requested = None if reductions is None else [_split_reduction(r) for r in reductions]

    rows = []
    seen_reductions: set[tuple[str, bool]] = set()
    for tensor in tensors:
        for step in tensor.steps():
            step_mode, mode_step = trial.mode_modestep(step)
            if mode is not None and step_mode != mode:
                continue
            if wanted_steps is not None and (mode_step if mode else step) not in wanted_steps:
                continue
            per_worker = tensor._step(step, ModeKeys.GLOBAL)
            for who in sorted(per_worker):
                if worker is not None and who != worker:
                    continue
                data = per_worker[who]
                row = {
                    "tensor": tensor.name,
                    "step": step,
                    "mode": step_mode.name,
                    "mode_step": mode_step,
                    "worker": who,
                }
                value = None
                if data.location is not None and (values or requested):
                    try:
                        value = tensor.value(step, worker=who)
                    except CorruptTensorRecord:  # warned of once by the trial; left out, as values() does
                        continue
                if values:
                    row["value"] = _cell(value)
                for key in requested if requested is not None else sorted(data.reductions):
                    seen_reductions.add(key)
                    row[_reduction_label(*key)] = _reduction(tensor, step, who, key, data, value)
                rows.append(row)
    labels = [_reduction_label(*key) for key in (requested or sorted(seen_reductions))]
    columns = [c for c in COLUMNS if values or c != "value"] + labels
    df = pd.DataFrame(rows, columns=columns)
    return df.astype({"step": "int64", "mode_step": "int64"}) if len(df) else df


def _check(trial: Trial, collection) -> None:
    if isinstance(collection, str) and collection not in trial.collections():
        have = sorted(trial.collections())
        raise SMDebugValueError(
            f"collection {collection!r} is not in {trial.path}{did_you_mean(collection, have)} "
            f"(collections: {', '.join(have) or '-'})"
        )


def _split_reduction(name: str) -> tuple[str, bool]:
    name = str(name)
    key = (name[4:], True) if name.startswith("abs_") else (name, False)
    if key[0] not in ALLOWED_REDUCTIONS + ALLOWED_NORMS:
        known = ", ".join(ALLOWED_REDUCTIONS + ALLOWED_NORMS)
        raise SMDebugValueError(f"unknown reduction {name!r}: choose from {known} (or abs_<name>)")
    return key


def _reduction_label(reduction: str, absolute: bool) -> str:
    return f"abs_{reduction}" if absolute else reduction


def _cell(value):
    if value is None:
        return None
    value = np.asarray(value)
    if value.size == 1 and value.dtype.kind in "biuf":
        return value.reshape(-1)[0].item()
    return value


def _reduction(tensor: Tensor, step: int, worker: str, key, data, value) -> float:
    reduction, absolute = key
    if key not in data.reductions and value is None:
        return float("nan")
    try:
        if key in data.reductions:
            return float(np.asarray(tensor.reduction_value(step, reduction, worker=worker, abs=absolute)))
        return numpy_reduction(value, reduction, absolute)
    except (TensorUnavailableForStep, TypeError, ValueError):
        return float("nan")


def _run_frame(run, options: dict, template=None):
    """One run's frame with the run's path as first column (conformed to ``template`` when given)."""
    df = _frame(run, **options, strict=False)
    df.insert(0, "run", run if isinstance(run, str) else run.path)
    if template is not None:
        df = df.reindex(columns=list(template.columns)).astype(template.dtypes.to_dict())
    return df


def _dask_frame(runs: list, options: dict):
    dd = require("dask.dataframe", "to_dataframe(dask=True)", pip_name="dask")
    paths = [r if isinstance(r, str) else r.path for r in runs]  # workers open the runs themselves
    meta = _run_frame(runs[0], options).iloc[:0]
    return dd.from_map(_run_frame, paths, options=options, template=meta, meta=meta, enforce_metadata=False)
