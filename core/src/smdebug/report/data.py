"""What a report shows, read from a Trial as plain data (JSON-ready), downsampled so that the page stays
small whatever the run's size.

Scaling: a curve keeps at most ``max_points`` saved steps, a heatmap at most ``max_steps`` columns and
``max_cells`` cells (every layer is a row; with many layers there are fewer columns), each cell two bytes;
at most ``max_curves`` curves are drawn.
Steps are chosen evenly spaced among those saved, and only those are read: a 1000-layer, 100,000-step
run gives a page of a few MB, and the page says what it left out.
"""

from __future__ import annotations

import base64
import math
import time
from dataclasses import dataclass

import numpy as np

from smdebug.exceptions import SMDebugError, SMDebugValueError
from smdebug.modes import ModeKeys

# heatmap cell codes (uint16): 1..CODE_MAX the value on the heatmap's scale, then these
CODE_MAX = 65533
NON_FINITE = 65534
MISSING = 65535
SCALAR_COLLECTIONS = ("losses", "metrics", "sm_metrics", "scalars")


@dataclass
class Limits:
    max_points: int = 2000  # saved steps read per curve
    max_steps: int = 400  # heatmap columns
    max_cells: int = 400_000  # heatmap cells (layers x columns)
    max_tensors: int = 2000  # rows of the tensor table
    max_curves: int = 100  # line charts (losses first, then metrics and scalars)


def collect(trial, *, reduction: str | None = None, rules: bool = True, limits: Limits | None = None) -> dict:
    """Everything the page shows, as plain data."""
    from smdebug.cli.ls import describe

    limits = limits or Limits()
    notes: list[str] = []
    info = describe(trial)
    firings, rule_rows = _rules(trial) if rules else ([], None)
    data = {
        "title": trial.name,
        "path": trial.path,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "training_ended": info["training_ended"],
        "steps": len(info["steps"]),
        "last_step": info["steps"][-1] if info["steps"] else None,
        "workers": info["workers"],
        "unsaved": info["unsaved_steps"],
        "unsaved_tensors": info["unsaved_tensors"],
        "modes": {m: len(s["mode_steps"]) for m, s in info["modes"].items()},
        "collections": info["collections"],
        "tensors": info["tensors"][: limits.max_tensors],
        "tensor_count": len(info["tensors"]),
        "rules": rule_rows,
        "stop_signal": _stop_signal(trial),
        "training_firings": info.get("rule_firings", []),
        "provenance": _provenance(trial),
        "notes": notes,
    }
    if len(info["tensors"]) > limits.max_tensors:
        notes.append(
            f"the tensor table lists the first {limits.max_tensors} of {len(info['tensors'])} tensors"
        )
    marks = [{"step": f["step"], "label": f"{f['rule']} fired"} for f in firings]
    # the in-training firings (hook.add_rule): the first ones of each rule, as for the evaluated rules
    per_rule: dict[str, int] = {}
    for f in data["training_firings"]:
        per_rule[f["rule"]] = per_rule.get(f["rule"], 0) + 1
        if per_rule[f["rule"]] <= 20:
            marks.append({"step": f["step"], "label": f"{f['rule']} fired during training"})
    if data["stop_signal"]:
        signal = data["stop_signal"]
        marks.append({"step": signal.get("step", -1), "label": f"{signal.get('rule')} stopped training"})
    provenance = data["provenance"]
    if provenance and isinstance(provenance.get("step"), int):
        marks.append({"step": provenance["step"], "label": "first non-finite value"})
    # the charts show one worker's values (the header names it): the others' would fill its missing steps
    worker = info["workers"][0] if info["workers"] else None
    data["curves"] = _curves(trial, limits, notes, marks, worker)
    data["gradients"] = _gradient_heatmap(trial, reduction, limits, notes, worker)
    data["unavailable"] = {}  # why a heatmap is missing although the run saved what it is made of
    data["update_ratio"] = _update_ratio_heatmap(trial, limits, notes, data["unavailable"], worker)
    # damaged steps, as `smdebug ls` lists them: a malformed index file, or a record found damaged while
    # the page read it (so this comes last)
    data["damaged"] = {w: {str(s): why for s, why in steps.items()} for w, steps in trial.corrupt().items()}
    return data


# -- rules ----------------------------------------------------------------------------------------------
def _rules(trial) -> tuple[list[dict], list[dict]]:
    """The built-in rules evaluated over the saved steps, as ``smdebug rules RUN`` does."""
    from smdebug.cli.rules import evaluate_steps, rule_states
    from smdebug.rules.rule import nothing_checked

    states = rule_states(trial)
    evaluate_steps([s for s in states if s.rule is not None], trial.steps())
    rows, firings = [], []
    for s in states:
        nodata = "" if s.fired or s.error or s.rule is None else nothing_checked(s.rule)
        result = "fired" if s.fired else "error" if s.error else "skipped" if s.skipped else "ok"
        result = "no data" if nodata else result
        details = s.reason or s.error or s.skipped or nodata
        rows.append({"rule": s.name, "result": result, "steps": s.fired, "details": details})
        firings += [{"rule": s.name, "step": step} for step in s.fired[:20]]  # marks: the first ones
    return firings, rows


def _stop_signal(trial) -> dict | None:
    """The rule that stopped training while it ran (the stop signal a firing rule left in the run)."""
    from smdebug.rules.actions import read_stop_signal

    try:
        return read_stop_signal(trial.store)
    except (OSError, SMDebugError):
        return None


def _provenance(trial) -> dict | None:
    """The first non-finite value's provenance, where the Trial records one (``first_nonfinite()``)."""
    method = getattr(trial, "first_nonfinite", None)
    if not callable(method):
        return None
    try:
        found = method()
    except Exception:  # a run without the record, or one it cannot read: no panel
        return None
    return _plain(found) if isinstance(found, dict) else None


# -- curves ---------------------------------------------------------------------------------------------
def _curves(trial, limits: Limits, notes: list[str], marks: list[dict], worker: str | None) -> list[dict]:
    names: list[str] = []
    for collection in SCALAR_COLLECTIONS:
        names += [n for n in trial.tensor_names(collection=collection) if n not in names]
    names += [n for n in trial.tensor_names(regex="^scalar/") if n not in names]
    if len(names) > limits.max_curves:
        notes.append(f"curves: {limits.max_curves} of {len(names)} curves drawn (losses first)")
        names = names[: limits.max_curves]
    curves = []
    for name in names:
        tensor = trial.tensor(name)
        shown = _shown_worker(tensor, worker)
        steps = _saved_steps(tensor, shown)
        chosen = _evenly(steps, limits.max_points)
        if len(chosen) < len(steps):
            notes.append(f"curve {name}: {len(chosen)} of {len(steps)} saved steps, evenly spaced")
        series: dict[str, dict] = {}
        summaries: set[str] = set()
        for step in chosen:
            value, summary = _scalar_value(tensor, step, shown)
            if value is None:
                continue
            if summary:
                summaries.add(summary)
            mode = trial.mode(step)
            line = series.setdefault(mode.name if mode is not None else "GLOBAL", {"x": [], "y": []})
            line["x"].append(step)
            line["y"].append(value)
        if series:
            curves.append(
                {
                    "name": name,
                    "series": [{"name": m, **s} for m, s in series.items()],
                    "marks": marks,
                    "summary": "; ".join(sorted(summaries)),  # how a step's value was made one number
                }
            )
    return curves


def _scalar_value(tensor, step: int, worker: str | None = None) -> tuple:
    """(the step's value as one number, or None; how it was made one number: "" for a single value). A
    per-sample loss (Gluon's, torch's reduction="none") is its mean; a tensor saved as reductions only,
    its mean reduction."""
    try:
        value = tensor.value(step, worker=worker)
    except SMDebugError:
        try:
            return _finite(_one(tensor.reduction_value(step, "mean", worker=worker))), "saved as its mean"
        except SMDebugError:
            return None, ""
    if value.dtype.kind not in "biuf" or value.size == 0:
        return None, ""
    if value.size == 1:
        return _finite(float(value.reshape(-1)[0])), ""
    with np.errstate(all="ignore"):
        return _finite(float(value.mean(dtype=np.float64))), f"mean of each step's {value.size} values"


def _one(value) -> float:
    return float(np.asarray(value).reshape(-1)[0])


# -- heatmaps -------------------------------------------------------------------------------------------
def _layers(trial, names: list[str], prefix: str) -> list[tuple[str, str]]:
    """(layer label, tensor name), in model order: where the run first saved the layer's weight (or the
    tensor itself)."""
    from smdebug.trials.divergence import saved_order

    saved = saved_order(trial)
    position = {n: i for i, n in enumerate(saved)}
    layer: dict[str, int] = {}  # a layer's place: where any of its tensors came first
    for i, name in enumerate(saved):
        layer.setdefault(_module(name[len(prefix) :] if prefix and name.startswith(prefix) else name), i)
    labelled = [(n[len(prefix) :] if prefix and n.startswith(prefix) else n, n) for n in names]
    end = len(saved)
    return sorted(labelled, key=lambda ln: (layer.get(_module(ln[0]), end), position.get(ln[1], end), ln[1]))


def _module(name: str) -> str:
    """The layer a parameter belongs to: "Net_fc1" of "Net_fc1.weight"."""
    return name.rsplit(".", 1)[0]


def _grid(
    trial, tensors: list[str], limits: Limits, notes: list[str], what: str, worker: str | None, keep=None
) -> list[int]:
    steps = sorted(
        {
            s
            for n in tensors
            for s in _saved_steps(trial.tensor(n), _shown_worker(trial.tensor(n), worker))
            if keep is None or keep(s)
        }
    )
    columns = max(1, min(limits.max_steps, limits.max_cells // max(1, len(tensors))))
    chosen = _evenly(steps, columns)
    if len(chosen) < len(steps):
        notes.append(
            f"{what}: {len(chosen)} of {len(steps)} saved steps shown, evenly spaced "
            f"({len(tensors)} layers; at most {limits.max_cells:,} cells)"
        )
    return chosen


def _gradient_heatmap(
    trial, reduction: str | None, limits: Limits, notes: list[str], worker: str | None
) -> dict | None:
    names = trial.tensor_names(collection="gradients") or trial.tensor_names(regex="^gradient/")
    if not names:
        return None
    layers = _layers(trial, names, "gradient/")
    key = _reduction_key(trial, [n for _, n in layers], reduction, worker)
    if key is None:
        return None
    name, absolute = key
    steps = _grid(trial, [n for _, n in layers], limits, notes, "gradient heatmap", worker)
    grid = np.full((len(layers), len(steps)), np.nan)
    present = np.zeros(grid.shape, dtype=bool)
    for i, (_, tname) in enumerate(layers):
        tensor = trial.tensor(tname)
        shown = _shown_worker(tensor, worker)
        saved = set(_saved_steps(tensor, shown))
        for j, step in enumerate(steps):
            if step in saved:
                try:
                    grid[i, j] = float(
                        np.asarray(tensor.reduction_value(step, name, worker=shown, abs=absolute)).reshape(
                            -1
                        )[0]
                    )
                    present[i, j] = True
                except SMDebugError:
                    pass
    label = f"abs_{name}" if absolute else name
    if reduction and not present.any() and steps:  # asked for a reduction the gradients do not hold
        found = _reduction_key(trial, [n for _, n in layers], None, worker)
        held = "nothing readable" if found is None else f"{'abs_' if found[1] else ''}{found[0]}"
        raise SMDebugValueError(
            f"reduction {label!r}: no gradient holds it (they were saved as {held}; --reduction chooses one)"
        )
    title = "gradient norm (l2)" if label == "l2" else f"gradient {label}"
    return _heatmap(title, [lbl for lbl, _ in layers], steps, grid, present)


def _update_ratio_heatmap(
    trial, limits: Limits, notes: list[str], why: dict, worker: str | None
) -> dict | None:
    """||w_t - w_prev|| / ||w_prev|| between consecutive saved steps of each weight saved as a value;
    None, with the reason in ``why["update_ratio"]`` when weights were saved as values, if no ratio is."""
    names = [
        n
        for c in ("weights", "biases")
        for n in trial.tensor_names(collection=c)
        if _has_values(trial.tensor(n), worker)
    ]
    if not names:
        return None
    layers = _layers(trial, names, "")
    # training steps only, when the run has them: weights do not move while a model is evaluated
    training = {ModeKeys.TRAIN, ModeKeys.GLOBAL}
    keep = (lambda s: trial.mode(s) in training) if ModeKeys.TRAIN in trial.modes() else None
    steps = _grid(trial, names, limits, notes, "weight-update ratio heatmap", worker, keep)
    grid = np.full((len(layers), len(steps)), np.nan)
    present = np.zeros(grid.shape, dtype=bool)
    most = 0  # the most training steps a weight was saved at
    for i, (_, tname) in enumerate(layers):
        tensor = trial.tensor(tname)
        shown = _shown_worker(tensor, worker)
        saved = [s for s in _saved_steps(tensor, shown) if keep is None or keep(s)]
        most = max(most, len(saved))
        index = {s: k for k, s in enumerate(saved)}
        for j, step in enumerate(steps):
            k = index.get(step)
            if not k:  # not saved here, or its first step (no update before it)
                continue
            try:
                now = np.asarray(tensor.value(step, worker=shown), dtype=np.float64)
                before = np.asarray(tensor.value(saved[k - 1], worker=shown), dtype=np.float64)
            except SMDebugError:
                continue
            base = np.linalg.norm(before)
            if now.shape != before.shape or base == 0:  # a weight that was all zeros: no ratio
                continue
            with np.errstate(all="ignore"):
                grid[i, j] = np.linalg.norm(now - before) / base
            present[i, j] = True
    if not present.any():
        if most < 2:
            why["update_ratio"] = (
                "the weights were saved as values at one training step only: a ratio needs two"
            )
        else:
            why["update_ratio"] = (
                "no weight was saved at two training steps with a nonzero value at the first"
            )
        return None
    heatmap = _heatmap("weight-update ratio ||Δw|| / ||w||", [lbl for lbl, _ in layers], steps, grid, present)
    heatmap["missing"] = "no ratio: not saved, its first step, or the weight before was all zeros"
    return heatmap


def _shown_worker(tensor, worker: str | None) -> str | None:
    """The worker whose values a chart takes of ``tensor``: ``worker``; None (the full tensor assembled
    from every worker's shard) for a sharded tensor."""
    return None if worker is None or tensor.trial.placements(tensor.name) else worker


def _saved_steps(tensor, worker: str | None) -> list[int]:
    """The steps ``worker`` saved ``tensor`` at (any worker's, for None)."""
    steps = tensor.steps()
    if worker is None or len(tensor.trial.workers()) == 1:
        return steps
    return [s for s in steps if worker in tensor.workers(s)]


def _has_values(tensor, worker: str | None) -> bool:
    worker = _shown_worker(tensor, worker)
    steps = _saved_steps(tensor, worker)
    return bool(steps) and tensor._worker_data(steps[-1], ModeKeys.GLOBAL, worker).location is not None


def _reduction_key(
    trial, names: list[str], wanted: str | None, worker: str | None
) -> tuple[str, bool] | None:
    """The reduction a heatmap shows: ``wanted`` ("l2", "abs_max", ...), else l2 where values or l2 norms
    were saved, else the reduction saved most often."""
    if wanted:
        return (wanted[4:], True) if wanted.startswith("abs_") else (wanted, False)
    counts: dict[tuple[str, bool], int] = {}
    for n in names:
        tensor = trial.tensor(n)
        shown = _shown_worker(tensor, worker)
        steps = _saved_steps(tensor, shown)
        if not steps:
            continue
        data = tensor._worker_data(steps[-1], ModeKeys.GLOBAL, shown)
        if data.location is not None:
            return ("l2", False)
        for key in data.reductions:
            counts[key] = counts.get(key, 0) + 1
    if ("l2", False) in counts:
        return ("l2", False)
    return max(counts, key=counts.get) if counts else None


def _heatmap(title: str, rows: list[str], steps: list[int], grid: np.ndarray, present: np.ndarray) -> dict:
    """The grid as uint16 codes (base64): log10 scale when every value is >= 0, else linear."""
    finite = present & np.isfinite(grid)
    values = grid[finite]
    log = bool(values.size) and bool((values >= 0).all())
    positive = values[values > 0] if log else values
    if positive.size:
        scaled = np.log10(positive) if log else positive
        lo, hi = float(scaled.min()), float(scaled.max())
    else:
        lo, hi = 0.0, 1.0
    if hi <= lo:
        hi = lo + 1.0
    codes = np.full(grid.shape, MISSING, dtype="<u2")
    codes[present & ~np.isfinite(grid)] = NON_FINITE
    with np.errstate(all="ignore"):
        scaled_grid = np.log10(grid) if log else grid
        fraction = np.clip((scaled_grid - lo) / (hi - lo), 0, 1)
    on_scale = finite & (grid > 0 if log else finite)
    codes[on_scale] = 1 + np.round(fraction[on_scale] * (CODE_MAX - 1)).astype("<u2")
    if log:
        codes[finite & (grid == 0)] = 0  # exactly zero: below any log scale
    return {
        "title": title,
        "rows": rows,
        "steps": steps,
        "scale": "log" if log else "linear",
        "lo": lo,
        "hi": hi,
        "codes": base64.b64encode(np.ascontiguousarray(codes).tobytes()).decode("ascii"),
        "non_finite": int((present & ~np.isfinite(grid)).sum()),
    }


# -- helpers --------------------------------------------------------------------------------------------
def _evenly(steps: list[int], limit: int) -> list[int]:
    """At most ``limit`` of the steps, evenly spaced, the first and the last included."""
    if len(steps) <= limit:
        return list(steps)
    picks = np.unique(np.round(np.linspace(0, len(steps) - 1, limit)).astype(int))
    return [steps[i] for i in picks]


def _finite(value: float):
    return value if math.isfinite(value) else str(value)


def _plain(value):
    from smdebug.trials.divergence import json_safe

    def convert(v):
        if isinstance(v, np.ndarray):
            return v.tolist()
        if isinstance(v, dict):
            return {str(k): convert(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [convert(x) for x in v]
        if isinstance(v, (str, int, float, bool, type(None), np.generic)):
            return v
        return str(v)

    return json_safe(convert(value))
