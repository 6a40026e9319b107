"""``smdebug show OUT TENSOR``: a tensor's saved steps, or its value at one step."""

from __future__ import annotations

import sys

import numpy as np

from smdebug.cli._common import (
    add_mode_argument,
    compact_steps,
    open_trial,
    parse_mode,
    require_tensor,
    require_worker,
    table,
)
from smdebug.exceptions import CorruptTensorRecord, SMDebugError, SMDebugValueError
from smdebug.modes import ModeKeys
from smdebug.reductions import numpy_reduction


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "show",
        help="show a tensor: a summary of every saved step, or its value at one step",
        description="Show a saved tensor. Without --step, one line per saved step (the value of a "
        "one-element tensor, else min/max/mean/l2 and the saved reductions); with --step, the value.",
    )
    parser.add_argument("out_dir", metavar="OUT", help="the run's output location (path or URI)")
    parser.add_argument("tensor", metavar="TENSOR", help="the tensor's name (see `smdebug ls`)")
    parser.add_argument("--step", type=int, help="print the value at this step (a mode step with --mode)")
    add_mode_argument(parser)
    parser.add_argument("--worker", help="whose value to show (default: the first worker)")
    parser.add_argument("--full", action="store_true", help="print every element, in full precision")
    parser.set_defaults(func=run)


def _fmt(x) -> str:
    return f"{float(x):.6g}"


def _summary(tensor, step: int, worker) -> tuple[str, str]:
    """(shape, summary) of one global step."""
    data = tensor._worker_data(step, ModeKeys.GLOBAL, worker)
    saved = ", ".join(
        f"{'abs_' if a else ''}{r}={_fmt(tensor.reduction_value(step, r, worker=worker, abs=a))}"
        for r, a in sorted(data.reductions)
    )
    if data.location is None:
        shape = str(tuple(data.shape)) if data.shape is not None else "-"
        return shape, saved or "(shape only)"
    value = np.asarray(tensor.value(step, worker=worker))
    shape = str(value.shape)
    if value.dtype.kind not in "biuf" or value.size == 0:
        text = np.array2string(value, threshold=6)
    elif value.size == 1:
        text = _fmt(value.reshape(-1)[0])
    else:
        stats = {r: numpy_reduction(value, r) for r in ("min", "max", "mean", "l2")}
        text = " ".join(f"{k}={_fmt(v)}" for k, v in stats.items())
    return shape, f"{text}  [{saved}]" if saved else text


def run(args) -> int:
    trial = open_trial(args.out_dir)
    require_tensor(trial, args.tensor)
    tensor = trial.tensor(args.tensor)
    args.worker = require_worker(trial, args.worker)
    mode = parse_mode(args.mode)
    query_mode = mode or ModeKeys.GLOBAL
    if args.step is not None:
        return _show_step(trial, tensor, args.step, query_mode, args.worker, args.full)
    rows, damaged = [], []
    for step in tensor.steps():
        step_mode, mode_step = trial.mode_modestep(step)
        if mode not in (None, ModeKeys.GLOBAL) and step_mode != mode:
            continue
        workers = [args.worker] if args.worker else tensor.workers(step)
        for worker in workers:
            try:
                shape, text = _summary(tensor, step, worker)
            except CorruptTensorRecord as exc:  # the other steps are still worth showing
                damaged.append(f"step {step} ({worker}): {exc.reason}")
                shape, text = "?", "DAMAGED record (not readable; see below)"
            rows.append([str(step), step_mode.name, str(mode_step), worker, shape, text])
    if not rows:
        where = f" in mode {mode.name}" if mode else ""
        print(f"{args.tensor}: no saved steps{where}")
        return 0
    print(f"{args.tensor} ({len(rows)} saved step{'s' if len(rows) != 1 else ''}):")
    print(table(rows, ["STEP", "MODE", "MODE_STEP", "WORKER", "SHAPE", "VALUE"]))
    for line in damaged:
        print(f"smdebug show: damaged record at {line}", file=sys.stderr)
    return 0


def _show_step(trial, tensor, step: int, mode: ModeKeys, worker, full: bool) -> int:
    saved = tensor.steps(mode=mode)
    if step not in saved:  # a step it was not saved at: say the steps it was (the nearest first)
        near = sorted(saved, key=lambda s: (abs(s - step), s))[:1]
        hint = f"; the nearest saved is {near[0]}" if near else ""
        which = "" if mode == ModeKeys.GLOBAL else f"{mode.name} "
        raise SMDebugValueError(
            f"{tensor.name} is not available at {which}step {step}{hint}; its {which}steps: {compact_steps(saved)}"
        )
    global_step = trial.global_step(mode, step) if mode != ModeKeys.GLOBAL else step
    data = tensor._worker_data(step, mode, worker)
    step_mode, mode_step = trial.mode_modestep(global_step)
    who = worker or tensor.workers(global_step)[0]
    if worker is None and trial.placements(tensor.name):  # value() assembles a sharded tensor's shards
        who = "the full tensor, from the shards of " + ", ".join(sorted(trial.placements(tensor.name)))
    print(f"{tensor.name} at step {global_step} ({step_mode.name} step {mode_step}, {who})")
    for r, a in sorted(data.reductions):
        print(
            f"  {'abs_' if a else ''}{r}: {_fmt(tensor.reduction_value(step, r, mode=mode, worker=worker, abs=a))}"
        )
    if data.location is None:
        try:
            print(f"  shape: {tuple(tensor.shape(step, mode=mode, worker=worker))}")
        except SMDebugError:
            pass
        print("  (only reductions of this tensor were saved at this step)")
        return 0
    value = np.asarray(tensor.value(step, mode=mode, worker=worker))
    print(f"  shape: {value.shape}  dtype: {value.dtype}")
    options = {"threshold": np.inf, "floatmode": "unique"} if full else {}  # every element, exactly
    with np.printoptions(**options):
        print("  " + (np.array2string(value, prefix="  ") if value.ndim else repr(value.item())))
    return 0
