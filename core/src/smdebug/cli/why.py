"""``smdebug why RUN``: where a run's first non-finite value came from, and what led to it."""

from __future__ import annotations

import json
import math

from smdebug.cli._common import compact_steps, open_trial
from smdebug.exceptions import CorruptRunError, SMDebugError

_WHERE = {
    "input": "in the input batch ({tensor})",
    "forward": "in the forward pass: the output of module {module} ({tensor}), from finite inputs",
    "loss": "in the loss ({tensor}), from finite model outputs",
    "backward": "in the backward pass: {tensor} (module {module}), the forward pass and the loss being finite",
}


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "why",
        help="explain where a run's first non-finite value came from (runs saved with health=True)",
        description=(
            "Say where the run's first non-finite value appeared (input batch, a module's forward output, "
            "the loss or a gradient; step, mode, worker) and what the flight recorder shows of the steps "
            "before it. RUN is a local path or any fsspec URI."
        ),
    )
    parser.add_argument("out_dir", metavar="RUN", help="the run's output location")
    parser.add_argument("--json", action="store_true", help="print the first non-finite value as JSON (null)")
    parser.set_defaults(func=run)


def explain(trial) -> str:
    """The paragraph ``smdebug why`` prints."""
    from smdebug.health import HEALTH_DIR, first_nonfinite

    records = trial.health_records()  # (read once: a damaged record is warned of once)
    first = first_nonfinite(records)
    unread = [] if records else trial.store.list(HEALTH_DIR)  # record files, none of them readable
    if unread:
        damaged = ", ".join(f"{trial.path}/{p}" for p in unread)
        raise CorruptRunError(f"the run's health record is damaged, nothing can be said: {damaged}")
    if not records:
        return (
            f"Nothing was found in {trial.path}: it holds no health record (train with health=True, or "
            "`smdebug run --health`, to watch every step of PyTorch, Keras or MXNet training)."
        )
    triggers = [t for r in records for t in r.get("triggers", []) if isinstance(t, dict)]
    if first is None:
        text = (
            f"Nothing was found: no non-finite value on {', '.join(r.get('worker', '?') for r in records)} "
            f"(every step watched, saved steps {compact_steps(trial.steps())})."
        )
        if triggers:
            text += " The flight recorder was written for: " + "; ".join(_trigger(t) for t in triggers) + "."
        return text
    step = int(first["step"])
    where = _WHERE.get(first.get("direction"), "at {tensor}").format(
        tensor=first.get("tensor"), module=first.get("module")
    )
    params = first.get("parameters") or []
    if params:  # (the weights a step starts with are those the previous update left)
        where += f"; its own parameters were already non-finite as the step began ({', '.join(params)})"
    text = (
        f"The first non-finite value appeared at step {step} ({first.get('mode')} step "
        f"{first.get('mode_step', step)}) on {first.get('worker')}, {where}."
    )
    return f"{text} {_before(trial, step, first.get('worker'))}"


def _trigger(t: dict) -> str:
    return f"{t.get('reason')} (step {t.get('step')})"


def _before(trial, step: int, worker: str | None) -> str:
    """What the recorder of that worker shows of the steps up to the bad one: the loss, the largest
    gradient norm."""
    workers = trial.workers()
    whose = "The flight recorder"
    if worker not in workers and workers:  # it saved no tensors (include_workers): another worker's
        if worker is not None:
            whose = f"{worker} saved no tensors (include_workers); the flight recorder of {workers[0]}"
        worker = workers[0]
    l2, finite = {}, {}  # (finite: by max |x| where saved; an l2 overflows for finite values near 1e38)
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        values, ok = {}, {}
        for s in tensor.steps():
            if s > step or worker not in tensor.workers(s):
                continue
            try:
                values[s] = float(tensor.reduction_value(s, "l2", worker=worker))
            except SMDebugError:
                continue
            try:
                ok[s] = math.isfinite(float(tensor.reduction_value(s, "max", abs=True, worker=worker)))
            except SMDebugError:
                ok[s] = math.isfinite(values[s])
        if values:
            l2[name], finite[name] = values, ok
    steps = sorted({s for values in l2.values() for s in values if s < step})
    if not steps:
        return f"{whose} holds no step before it."
    parts = [f"{whose} holds steps {compact_steps(steps)} before it"]
    losses = [n for n in l2 if "loss" in n.lower()] or [
        n for n in trial.tensor_names(collection="losses") if n in l2
    ]
    if losses:
        series = [l2[losses[0]][s] for s in steps if s in l2[losses[0]]]
        if series:
            parts.append(
                f"the loss went from {series[0]:.4g} to {series[-1]:.4g} (highest {max(series):.4g})"
            )
    members = set(trial.tensor_names(collection="gradients"))  # (torch, MXNet: gradient/; TF: gradients/)
    grads = {n: v for n, v in l2.items() if n in members or n.startswith(("gradient/", "gradients/"))}
    # (the steps that had gradients: a model called twice a step has none after its first call)
    grad_steps = [s for s in steps if any(s in v for v in grads.values())]
    if grad_steps:
        first, last = grad_steps[0], grad_steps[-1]
        top = max((n for n in grads if last in grads[n]), key=lambda n: _finite(grads[n][last]))
        growth = [(_finite(v.get(last)) / v[first], n) for n, v in grads.items() if v.get(first, 0) > 0]
        parts.append(f"the largest gradient norm at step {last} was {top}'s, {grads[top][last]:.4g}")
        if growth:
            ratio, name = max(growth)
            if ratio > 1:
                parts.append(f"the fastest-growing was {name}'s, x{ratio:.3g} since step {first}")
            else:  # (a falling norm is no growth: the one that fell least, x0.98, is not "fastest-growing")
                parts.append(f"no gradient norm grew since step {first}")
    bad = [n for n, ok in finite.items() if not ok.get(step, True)]
    # (MXNet's weights of a step are those its update left: one set to inf before the bad step shows there)
    early = sorted((s, n) for n, ok in finite.items() for s, x in ok.items() if s < step and not x)
    text = ": ".join([parts[0], "; ".join(parts[1:])]) if len(parts) > 1 else parts[0]
    if early:
        names = [n for s, n in early if s == early[0][0]]
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        text += f"; non-finite already at step {early[0][0]}: {', '.join(names[:3])}{more}."
    else:
        text += "; all were finite." if len(parts) > 1 else "."
    if bad:
        text += f" At step {step}, {len(bad)} of {len(l2)} recorded tensors were non-finite."
    return text


def _finite(value) -> float:
    return value if value is not None and math.isfinite(value) else -1.0


def run(args) -> int:
    trial = open_trial(args.out_dir)
    if args.json:
        print(json.dumps(trial.first_nonfinite(), indent=2))
        return 0
    print(explain(trial))
    return 0
