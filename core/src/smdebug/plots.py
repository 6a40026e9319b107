"""Plots of saved tensors over steps (matplotlib is optional: ``pip install matplotlib``)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from smdebug._optional import require
from smdebug.exceptions import CorruptTensorRecord, SMDebugValueError
from smdebug.modes import ModeKeys, to_mode
from smdebug.reductions import ALLOWED_NORMS, ALLOWED_REDUCTIONS, numpy_reduction

# Saved reductions to draw for a tensor saved as reductions only, best first.
_PREFERRED = [("l2", False), ("mean", False), ("abs_mean", True), ("max", False), ("abs_max", True)]


@dataclass
class Series:
    """One plotted line: a tensor's values (or one reduction of them) at the global steps of one mode."""

    tensor: str
    mode: ModeKeys
    what: str  # "value", or a reduction name such as "l2" or "abs_mean"
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        name = self.tensor if self.what == "value" else f"{self.what}({self.tensor})"
        return name if self.mode == ModeKeys.GLOBAL else f"{name} [{self.mode.name}]"


def match_tensors(trial, patterns: Sequence[str]) -> list[str]:
    """Tensor names for each pattern: an exact name, else a regex searched in every name (in order;
    case-insensitively when the exact case finds nothing)."""
    names = trial.tensor_names()
    found: list[str] = []
    for pattern in patterns:
        if pattern in names:
            hits = [pattern]
        else:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise SMDebugValueError(
                    f"{pattern!r} is neither a saved tensor nor a valid regex: {exc}"
                ) from None
            hits = [n for n in names if compiled.search(n)]
            if not hits:  # "loss" should find "CrossEntropyLoss_output_0"
                compiled = re.compile(pattern, re.IGNORECASE)
                hits = [n for n in names if compiled.search(n)]
        if not hits:
            close = difflib.get_close_matches(pattern, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise SMDebugValueError(f"no saved tensor matches {pattern!r}{hint}")
        found += [n for n in hits if n not in found]
    return found


def tensor_series(
    trial, name: str, *, reduction: str | None = None, mode=None, worker: str | None = None
) -> list[Series]:
    """A tensor over its saved steps, one Series per mode (only ``mode``'s when given).

    Without ``reduction``, a one-element tensor is drawn as its value, a larger one as its l2 norm, and
    one saved as reductions only as its saved reduction (l2, mean, abs_mean, ... whichever exists).
    ``reduction`` (e.g. "mean", "abs_max", "l2") picks the saved reduction, else computes it from the
    saved value.
    """
    key = None if reduction is None else _reduction_key(reduction)
    only = None if mode is None or to_mode(mode) == ModeKeys.GLOBAL else to_mode(mode)
    tensor = trial.tensor(name)
    by_key: dict[tuple[ModeKeys, str], Series] = {}
    for step in tensor.steps():
        step_mode = trial.mode(step)
        if only is not None and step_mode != only:
            continue
        data = tensor._worker_data(step, ModeKeys.GLOBAL, worker)
        try:
            what, value = _point(tensor, step, worker, data, key)
        except CorruptTensorRecord:  # warned of once by the trial; left out, as values() does
            continue
        if what is None:
            continue
        # one line per mode (and per kind, if the tensor was saved differently at other steps)
        series = by_key.get((step_mode, what))
        if series is None:
            series = by_key[step_mode, what] = Series(name, step_mode, what)
        series.steps.append(step)
        series.values.append(value)
    return list(by_key.values())


def _reduction_key(reduction: str) -> tuple[str, bool]:
    key = (reduction[4:], True) if reduction.startswith("abs_") else (reduction, False)
    if key[0] not in ALLOWED_REDUCTIONS + ALLOWED_NORMS:
        known = ", ".join(ALLOWED_REDUCTIONS + ALLOWED_NORMS)
        raise SMDebugValueError(f"unknown reduction {reduction!r}: choose from {known} (or abs_<name>)")
    return key


def _label(key: tuple[str, bool]) -> str:
    return f"abs_{key[0]}" if key[1] else key[0]


def _point(tensor, step, worker, data, key):
    """(what, value) drawn for one step, or (None, None) when nothing fits."""
    if key is not None:
        if key in data.reductions:
            stored = tensor.reduction_value(step, key[0], worker=worker, abs=key[1])
            return _label(key), float(np.asarray(stored).reshape(-1)[0])
        if data.location is None:
            return None, None
        return _label(key), numpy_reduction(tensor.value(step, worker=worker), *key)
    if data.location is not None:
        value = np.asarray(tensor.value(step, worker=worker))
        if value.dtype.kind not in "biuf" or value.size == 0:
            return None, None
        if value.size == 1:
            return "value", float(value.reshape(-1)[0])
        return "l2", numpy_reduction(value, "l2")
    for pref in [*_PREFERRED, *sorted(data.reductions)]:
        if pref in data.reductions:
            stored = tensor.reduction_value(step, pref[0], worker=worker, abs=pref[1])
            return _label(pref), float(np.asarray(stored).reshape(-1)[0])
    return None, None


def plot(
    trial,
    tensors: Sequence[str] | Sequence[Sequence[str]],
    output: str,
    *,
    reduction: str | None = None,
    mode=None,
    worker: str | None = None,
    log: bool | Sequence[bool] = False,
    separate: bool = False,
    title: str | None = None,
    panel_titles: Sequence[str] | None = None,
) -> list[list[Series]]:
    """Draw tensors over steps (see ``tensor_series``) to an image file (PNG, SVG, PDF by suffix).

    ``tensors`` holds names or regexes (see ``match_tensors``) drawn in one panel, or a list of such
    lists, one panel each (``separate=True`` gives each pattern its own panel). ``log`` sets a log y
    scale (one flag for all panels or one per panel). The x axis is the global step. Returns the
    Series drawn, per panel. Raises MissingDependencyError when matplotlib is not installed.
    """
    require("matplotlib", "plotting")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if isinstance(tensors, str):
        tensors = [tensors]
    groups = [[p] if isinstance(p, str) else list(p) for p in tensors]
    if not separate and all(isinstance(p, str) for p in tensors):
        groups = [list(tensors)]
    if not groups or not any(groups):
        raise SMDebugValueError("nothing to plot: name at least one tensor")
    panels: list[list[Series]] = []
    for patterns in groups:
        drawn = []
        for name in match_tensors(trial, patterns):
            drawn += [
                s
                for s in tensor_series(trial, name, reduction=reduction, mode=mode, worker=worker)
                if s.steps
            ]
        if not drawn:
            where = f" in mode {to_mode(mode).name}" if mode is not None else ""
            raise SMDebugValueError(f"no numeric values saved for {', '.join(patterns)}{where}")
        panels.append(drawn)
    logs = [log] * len(panels) if isinstance(log, bool) else list(log)

    figure = Figure(figsize=(9, 3.6 * len(panels)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(panels), 1, squeeze=False, sharex=True)[:, 0]
    for i, (ax, drawn) in enumerate(zip(axes, panels)):
        one_mode = len({series.mode for series in drawn}) == 1  # then the legend needs no mode
        for series in drawn:
            style = "-" if series.mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL) else "--"
            label = series.label.rsplit(" [", 1)[0] if one_mode else series.label
            ax.plot(
                series.steps,
                series.values,
                style,
                marker="." if len(series.steps) < 60 else None,
                label=label,
            )
        if i < len(logs) and logs[i]:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        legend_title = drawn[0].mode.name if one_mode and drawn[0].mode != ModeKeys.GLOBAL else None
        if len(drawn) > 4:  # many curves: keep the legend off them
            ax.legend(fontsize="small", title=legend_title, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        else:
            ax.legend(fontsize="small", title=legend_title, loc="best")
        if panel_titles is not None and i < len(panel_titles):
            ax.set_title(panel_titles[i])
    if title:
        figure.suptitle(title)
    figure.savefig(output)
    return panels
