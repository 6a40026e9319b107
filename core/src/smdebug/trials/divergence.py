"""Where two runs (or two workers of one run) part: ``diff(a, b)`` compares what both saved, tensor by
tensor and step by step, and finds each tensor's first step that differs beyond ``rtol``/``atol``.

Values are compared where both sides saved the value; where one side (or both) saved only reductions,
the reductions both have (a reduction of a saved value is computed from it, as ``reduction_value`` does).
What cannot be compared (a tensor or steps only one side saved, a value against disjoint reductions, a
damaged record) is said, never silently passed over.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from smdebug.exceptions import CorruptTensorRecord, SMDebugValueError, did_you_mean
from smdebug.layout import worker_from_file_name
from smdebug.modes import ModeKeys

COLUMNS = [
    "tensor",
    "status",
    "step",
    "mode",
    "mode_step",
    "compared",
    "max_abs_diff",
    "a",
    "b",
    "steps_compared",
    "workers",
    "detail",
    "not_compared",
]
DIFFERS, AGREES, NOT_COMPARED = "differs", "agrees", "not compared"


@dataclass
class TensorDiff:
    """One tensor's comparison: its first divergence (``step`` None when it agrees), or why it was not
    compared."""

    tensor: str
    status: str
    step: int | None = None
    mode: str | None = None
    mode_step: int | None = None
    compared: str = ""  # "value", or the reductions compared ("l2, abs_max")
    max_abs_diff: float | None = None  # at the first divergence
    a: object = None  # the two sides at the first divergence: a float for one element, else a summary
    b: object = None
    steps_compared: int = 0
    workers: str = ""
    detail: str = ""  # how the first divergence differs (shapes, which reduction)
    not_compared: str = ""  # what could not be compared, and why


@dataclass
class DiffResult:
    """Every tensor's comparison, the first divergence over all of them, and what was not compared."""

    a: str
    b: str
    rtol: float
    atol: float
    rows: list[TensorDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was not compared beyond single tensors (workers)

    @property
    def differs(self) -> bool:
        return any(r.status == DIFFERS for r in self.rows)

    @property
    def compared(self) -> int:
        return sum(r.status != NOT_COMPARED for r in self.rows)

    @property
    def first(self) -> TensorDiff | None:
        """The earliest divergence (by step, then in the order the run saved its tensors)."""
        found = [r for r in self.rows if r.status == DIFFERS]
        return min(found, key=lambda r: r.step) if found else None

    def to_dict(self) -> dict:
        first = self.first
        return {
            "a": self.a,
            "b": self.b,
            "rtol": self.rtol,
            "atol": self.atol,
            "differ": self.differs,
            "first": None if first is None else json_safe(asdict(first)),
            "notes": list(self.notes),
            "tensors": [json_safe(asdict(r)) for r in self.rows],
        }


def compare(
    a,
    b=None,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    workers: tuple[str, str] | None = None,
    collection: str | None = None,
    regex: str | None = None,
) -> DiffResult:
    """Compare runs ``a`` and ``b`` (Trials or paths); ``b`` None with ``workers=(W1, W2)`` compares two
    workers of ``a``. Without ``workers``, each worker is compared with the worker of the same name (a
    run of one worker with the other's one worker, whatever their names)."""
    from smdebug.trials.trial import Trial, create_trial

    if not all(math.isfinite(t) and t >= 0 for t in (rtol, atol)):  # nan or inf: no tolerance at all
        raise SMDebugValueError(f"rtol and atol must be finite numbers >= 0, got rtol={rtol}, atol={atol}")
    if b is None and workers is None:
        raise SMDebugValueError("diff needs two runs, or one run and workers=(W1, W2)")
    ta = a if isinstance(a, Trial) else create_trial(a)
    tb = ta if b is None else b if isinstance(b, Trial) else create_trial(b)
    pairs = _worker_pairs(ta, tb, workers)
    result = DiffResult(ta.path, tb.path, float(rtol), float(atol))
    for side, trial in [("a", ta)] + ([("b", tb)] if tb is not ta else []):
        if not trial.training_ended():
            result.notes.append(
                f"{side}: training has not ended (a live or interrupted run): compared up to step "
                f"{trial.steps()[-1] if trial.steps() else '-'}"
            )
    if workers is None:
        paired = [{wa for wa, _ in pairs}, {wb for _, wb in pairs}]
        for side, trial, done in (("a", ta, paired[0]), ("b", tb, paired[1])):
            alone = [w for w in trial.workers() if w not in done]
            if alone:
                result.notes.append(
                    f"Worker(s) only in {side}, not compared: {', '.join(alone)} (--workers W1 W2 pairs two)"
                )
    names_a, names_b = _selected(ta, collection, regex), _selected(tb, collection, regex)
    if not names_a and not names_b:
        what = f" (collection {collection!r})" if collection else f" (regex {regex!r})" if regex else ""
        known = set(ta.collections()) | set(tb.collections()) if collection else ()
        hint = did_you_mean(collection, known) if collection not in known else ""
        raise SMDebugValueError(f"no tensors to compare{what} in {ta.path} or {tb.path}{hint}")
    order = {name: i for i, name in enumerate(saved_order(ta))}
    keys = _step_keys(ta, tb)
    for name in sorted(set(names_a) | set(names_b), key=lambda n: (order.get(n, len(order)), n)):
        if name not in names_b or name not in names_a:
            side = "a" if name in names_a else "b"
            result.rows.append(TensorDiff(name, NOT_COMPARED, not_compared=f"saved only in {side}"))
            continue
        for wa, wb in pairs:
            row = _compare_tensor(ta.tensor(name), tb.tensor(name), wa, wb, rtol, atol, keys)
            row.workers = wa if wa == wb else f"{wa} vs {wb}"
            result.rows.append(row)
    # the first divergence first, then the later ones by step, then what agrees, then what was not compared
    rank = {DIFFERS: 0, AGREES: 1, NOT_COMPARED: 2}
    result.rows.sort(key=lambda r: (rank[r.status], r.step if r.step is not None else 0))
    return result


def diff(a, b=None, *, rtol: float = 1e-5, atol: float = 1e-8, workers=None, collection=None, regex=None):
    """Where runs ``a`` and ``b`` (or ``workers=(W1, W2)`` of run ``a``) first differ, as a pandas
    DataFrame: one row per tensor (and pair of workers), those that differ first, by the step where they
    part (``df.iloc[0]`` is the first divergence), then in the order the run saved them, with columns
    ``COLUMNS``: ``status`` ("differs", "agrees" or "not compared"), the first divergent ``step`` (global;
    ``mode`` and ``mode_step`` too), what was ``compared`` ("value" or reductions), ``max_abs_diff`` and
    the two sides ``a``/``b`` there, ``steps_compared``, a ``detail`` (how it differs: shapes, which
    reduction) and ``not_compared`` (what could not be compared, and why). ``df.attrs["first"]`` is the
    earliest divergence's row (a dict), or None when they agree. Needs pandas
    (``pip install 'smdebug-core[pandas]'``)."""
    from smdebug._optional import require

    pd = require("pandas", "smdebug.trials.diff")
    result = compare(a, b, rtol=rtol, atol=atol, workers=workers, collection=collection, regex=regex)
    frame = pd.DataFrame([asdict(r) for r in result.rows], columns=COLUMNS)
    for column in ("step", "mode_step", "steps_compared"):  # integers, missing where a tensor agrees
        frame[column] = frame[column].astype("Int64")
    frame.attrs.update(json_safe({k: v for k, v in result.to_dict().items() if k != "tensors"}))
    return frame


def saved_order(trial) -> list[str]:
    """Tensor names in the order the run first saved them (a model's layers in model order)."""
    trial.maybe_refresh()
    return list(trial._tensors)


# -- one tensor ---------------------------------------------------------------------------------------
def _step_keys(ta, tb):
    """(side, global step) -> what pairs a step of run a with a step of run b. A training step (TRAIN or
    GLOBAL) by its mode step, a validation (EVAL, PREDICT) step by the training step it follows and its
    place in that validation phase: runs that validate on other schedules still pair training step k with
    training step k, and the validations after it. By global step when that does not name each step once."""
    keys = []
    for trial in (ta, tb):
        key, trained, phase = {}, -1, (None, 0)
        for step in trial.steps():
            mode, mode_step = trial.mode_modestep(step)
            if mode in (ModeKeys.EVAL, ModeKeys.PREDICT):
                if phase[0] != (mode, trained):  # a new validation phase: the first of its steps
                    phase = ((mode, trained), mode_step)
                key[step] = (mode.name, trained, mode_step - phase[1])
            else:
                trained = mode_step
                key[step] = ("TRAIN", mode_step)
        keys.append(key if len(set(key.values())) == len(key) else None)
    if None in keys:
        return lambda side, step: step
    return lambda side, step: keys[side].get(step, step)


def _compare_tensor(ta, tb, wa: str, wb: str, rtol: float, atol: float, keys=None) -> TensorDiff:
    keys = keys or (lambda side, step: step)
    steps_a = {keys(0, s): s for s in ta.steps() if wa in ta.workers(s)}  # pairing key -> global step
    steps_b = {keys(1, s): s for s in tb.steps() if wb in tb.workers(s)}
    common = sorted(steps_a.keys() & steps_b.keys(), key=steps_a.get)
    notes = []
    if steps_a.keys() ^ steps_b.keys():
        only = len(steps_a.keys() - steps_b.keys()), len(steps_b.keys() - steps_a.keys())
        notes.append(f"steps saved by one side only: {only[0]} in a, {only[1]} in b")
    row = TensorDiff(ta.name, NOT_COMPARED)
    skipped = 0
    for key in common:
        step, step_b = steps_a[key], steps_b[key]
        try:
            outcome = _compare_step(ta, tb, step, step_b, wa, wb, rtol, atol)
        except CorruptTensorRecord as exc:
            notes.append(f"step {step} skipped: {exc}")
            skipped += 1
            continue
        if outcome is None:
            skipped += 1
            continue
        compared, diverged, max_abs, va, vb, detail = outcome
        row.steps_compared += 1
        row.compared = row.compared or compared
        if diverged:
            mode, mode_step = ta.trial.mode_modestep(step)
            row.status, row.step, row.compared = DIFFERS, step, compared
            row.mode = mode.name if mode is not None else None
            row.mode_step, row.max_abs_diff, row.a, row.b = mode_step, max_abs, va, vb
            row.detail = "; ".join(d for d in (detail, "" if step_b == step else f"b's step {step_b}") if d)
            break
    if row.status != DIFFERS and row.steps_compared:
        row.status = AGREES
    if skipped:
        notes.append(f"{skipped} common step(s) had nothing both sides saved in a comparable form")
    if not common:
        notes.append("no step saved by both")
    row.not_compared = "; ".join(notes)
    return row


def _compare_step(ta, tb, step: int, step_b: int, wa: str, wb: str, rtol: float, atol: float):
    """(compared, diverged, max_abs_diff, a, b, detail) of a's ``step`` and b's ``step_b``, or None when
    nothing is comparable."""
    da = ta._worker_data(step, ModeKeys.GLOBAL, wa)
    db = tb._worker_data(step_b, ModeKeys.GLOBAL, wb)
    if da.location is not None and db.location is not None:
        # a sharded tensor (each worker saved its shard) is compared whole, as an unsharded run saves it
        va = ta.value(step, worker=None if ta.trial.placements(ta.name) else wa)
        vb = tb.value(step_b, worker=None if tb.trial.placements(tb.name) else wb)
        if va.shape != vb.shape:
            return "value", True, None, _summary(va), _summary(vb), f"shapes differ: {va.shape} vs {vb.shape}"
        diverged, max_abs = _close(va, vb, rtol, atol)
        return "value", diverged, max_abs, _summary(va), _summary(vb), ""

    # reductions: those one side stored that the other stored too or can compute from its value
    def computable(data, key) -> bool:
        return key in data.reductions or data.location is not None

    keys = sorted(
        k for k in set(da.reductions) | set(db.reductions) if computable(da, k) and computable(db, k)
    )
    if not keys:
        return None
    ra = np.array([_scalar(ta.reduction_value(step, n, worker=wa, abs=ab)) for n, ab in keys])
    rb = np.array([_scalar(tb.reduction_value(step_b, n, worker=wb, abs=ab)) for n, ab in keys])
    diverged, max_abs = _close(ra, rb, rtol, atol)
    names = ", ".join(f"abs_{n}" if ab else n for n, ab in keys)
    if diverged:
        i = next(i for i in range(len(keys)) if _close(ra[i : i + 1], rb[i : i + 1], rtol, atol)[0])
        label = f"abs_{keys[i][0]}" if keys[i][1] else keys[i][0]
        return names, True, max_abs, float(ra[i]), float(rb[i]), f"reduction {label} differs"
    return names, False, max_abs, float(ra[0]), float(rb[0]), ""


def _scalar(value) -> float:
    return float(np.asarray(value).reshape(-1)[0])


def _close(va: np.ndarray, vb: np.ndarray, rtol: float, atol: float) -> tuple[bool, float | None]:
    """(diverged, largest absolute difference): NaN matches NaN and an infinity the same infinity."""
    if va.dtype.kind not in "biufc" or vb.dtype.kind not in "biufc":
        return bool(not np.array_equal(va, vb)), None
    a64 = va.astype(np.complex128 if va.dtype.kind == "c" else np.float64, copy=False)
    b64 = vb.astype(np.complex128 if vb.dtype.kind == "c" else np.float64, copy=False)
    ok = np.isclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True)
    with np.errstate(invalid="ignore"):
        gap = np.abs(a64 - b64)
    finite = gap[np.isfinite(gap)]
    max_abs = float(finite.max()) if finite.size else (None if gap.size == 0 else math.inf)
    if bool(ok.all()) and max_abs == math.inf:
        max_abs = 0.0  # infinities that match
    return bool(not ok.all()), max_abs


def _summary(value: np.ndarray):
    """A one-element tensor as its float, a larger one as a short description."""
    if value.size == 1 and value.dtype.kind in "biuf":
        return float(value.reshape(-1)[0])
    if value.dtype.kind in "biuf" and value.size:
        finite = value[~np.isnan(value)] if value.dtype.kind == "f" else value
        with np.errstate(invalid="ignore", over="ignore"):  # an all-NaN tensor: mean=nan, no warning
            mean = float(finite.mean(dtype=np.float64)) if finite.size else math.nan
        return f"{value.dtype}{list(value.shape)} mean={mean:.6g}"
    return f"{value.dtype}{list(value.shape)}"


def _worker_pairs(ta, tb, workers) -> list[tuple[str, str]]:
    wa_all, wb_all = ta.workers(), tb.workers()
    if workers is not None:
        try:
            w1, w2 = workers
        except (TypeError, ValueError):
            raise SMDebugValueError(f"workers: expected two worker names, got {workers!r}") from None
        named = []
        for w, t, have in ((w1, ta, wa_all), (w2, tb, wb_all)):
            name = worker_from_file_name(str(w))  # (a TF device also in its file-name form)
            if name not in have:
                raise SMDebugValueError(
                    f"worker {w!r} is not in {t.path}{did_you_mean(w, have)} (its workers: {', '.join(have) or '-'})"
                )
            named.append(name)
        return [tuple(named)]
    if len(wa_all) == 1 and len(wb_all) == 1:
        return [(wa_all[0], wb_all[0])]
    common = [w for w in wa_all if w in wb_all]
    if not common:
        raise SMDebugValueError(
            f"the runs share no worker ({', '.join(wa_all)} vs {', '.join(wb_all)}): give --workers W1 W2"
        )
    return [(w, w) for w in common]


def _selected(trial, collection, regex) -> list[str]:
    if collection is not None and regex is not None:
        by_collection = set(trial.tensor_names(collection=collection))
        return [n for n in trial.tensor_names(regex=regex) if n in by_collection]
    return trial.tensor_names(collection=collection, regex=regex)


def json_safe(value):
    """JSON-safe: non-finite floats as strings, numpy scalars as Python ones."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
