"""``smdebug ls OUT``: what a run holds (steps, modes, workers, collections, tensors)."""

from __future__ import annotations

import json

from smdebug.cli._common import compact_steps, open_trial, printable, table
from smdebug.exceptions import SMDebugError, SMDebugValueError, did_you_mean
from smdebug.modes import ModeKeys


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "ls",
        help="list the steps, modes, workers, collections and tensors of a run",
        description="List what a saved run holds. OUT is a local path or any fsspec URI (s3://...).",
    )
    parser.add_argument("out_dir", metavar="OUT", help="the run's output location")
    parser.add_argument("--collection", help="list only the tensors of this collection")
    parser.add_argument("--regex", help="list only the tensors whose name matches this regex")
    parser.add_argument("--json", action="store_true", help="print the listing as JSON")
    parser.set_defaults(func=run)


def describe(trial, collection: str | None = None, regex: str | None = None) -> dict:
    """The listing as plain data (what ``--json`` prints), of one state of a live run."""
    from smdebug.analysis.utils import no_refresh

    trial.steps()  # (re-read once, at most)
    with no_refresh(trial):
        return _describe(trial, collection, regex)


def _describe(trial, collection: str | None, regex: str | None) -> dict:
    modes = {}
    for mode in trial.modes(include_global=True):
        steps = trial.steps(mode=mode)
        modes[mode.name] = {"mode_steps": steps, "global_steps": [trial.global_step(mode, s) for s in steps]}
    collections = {name: len(trial.tensor_names(collection=name)) for name in sorted(trial.collections())}
    names = trial.tensor_names(collection=collection)
    if regex is not None:
        in_collection = set(names)
        names = [n for n in trial.tensor_names(regex=regex) if n in in_collection]
    tensors = []
    for name in names:
        tensor = trial.tensor(name)
        steps = tensor.steps()
        entry = {"name": name, "steps": len(steps), "shape": None, "saved": []}
        if steps:
            data = tensor._worker_data(steps[-1], ModeKeys.GLOBAL, None)
            if data.location is not None:
                entry["saved"].append("value")
            entry["saved"] += [f"abs_{r}" if a else r for r, a in sorted(data.reductions)]
            if data.shape is not None or data.location is not None:
                try:
                    entry["shape"] = list(tensor.shape(steps[-1]))
                except SMDebugError:
                    pass
        tensors.append(entry)
    unsaved = trial.unsaved()
    damaged = trial.corrupt()
    health = trial.health_records()
    firings = trial.rule_firings()
    return {
        "path": trial.path,
        "training_ended": trial.loaded_all_steps,
        # steps the run could not save, per worker (step -> why); empty when none were lost
        "unsaved_steps": {w: {str(s): why for s, why in steps.items()} for w, steps in unsaved.items()},
        # tensors a worker could not capture (the rest of their steps was saved): name -> {"step": the
        # first, "reason"}; empty when none
        "unsaved_tensors": trial.unsaved_tensors(),
        # damaged steps found, per worker (step -> what is wrong, the file named); a damaged index file's
        # step is left out of "steps"
        "damaged_steps": {w: {str(s): why for s, why in steps.items()} for w, steps in damaged.items()},
        "workers": trial.workers(),
        "steps": trial.steps(),
        "modes": modes,
        "collections": collections,
        "tensors": tensors,
        # health=True runs: where the first non-finite value appeared (None: none), else no key
        **({"first_nonfinite": trial.first_nonfinite()} if health else {}),
        # rules the hook ran during training (hook.add_rule) that fired, else no key
        **({"rule_firings": firings} if firings else {}),
    }


DAMAGED_LINES = 10  # damaged steps (unsaved tensors) described per worker: a bad run would fill the screen


def _print_capped(by_worker: dict, line, what: str) -> None:
    """Each worker's entries, ``line(worker, key, value)`` each, at most DAMAGED_LINES of them, then how
    many more there are."""
    for worker, entries in by_worker.items():
        for key, value in list(entries.items())[:DAMAGED_LINES]:
            print(printable(line(worker, key, value)))
        if len(entries) > DAMAGED_LINES:
            print(
                f"  ... {len(entries) - DAMAGED_LINES} more {what} of {printable(worker)} (--json lists them)"
            )


def run(args) -> int:
    trial = open_trial(args.out_dir)
    if args.collection is not None and args.collection not in trial.collections():
        names = ", ".join(sorted(trial.collections())) or "none"
        hint = did_you_mean(args.collection, trial.collections())
        raise SMDebugValueError(
            f"collection {args.collection!r} is not in the run{hint} (collections: {names})"
        )
    info = describe(trial, args.collection, args.regex)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    state = "training ended" if info["training_ended"] else "training not ended (live or interrupted)"
    lost = sorted({int(s) for steps in info["unsaved_steps"].values() for s in steps})
    if lost:
        state += f", {len(lost)} step(s) NOT SAVED"
    missing = {name for tensors in info["unsaved_tensors"].values() for name in tensors}
    if missing:
        state += f", {len(missing)} tensor(s) NOT SAVED"
    damaged = sorted({int(s) for steps in info["damaged_steps"].values() for s in steps})
    if damaged:
        state += f", {len(damaged)} step(s) DAMAGED"
    print(f"Run {printable(info['path'])}: {state}")
    print(f"Workers: {printable(', '.join(info['workers'])) or '-'}")
    print(f"Steps: {compact_steps(info['steps'])}")
    for worker, steps in info["unsaved_steps"].items():
        by_reason: dict[str, list[int]] = {}
        for step, why in steps.items():
            by_reason.setdefault(why, []).append(int(step))
        for why, group in by_reason.items():
            print(printable(f"Unsaved steps ({worker}): {_ranges(group)} ({why})"))
    _print_capped(
        info["unsaved_tensors"],
        lambda worker, name, what: (
            f"Unsaved tensor ({worker}): {name} from step {what['step']} ({what['reason']})"
        ),
        "unsaved tensor(s)",
    )
    _print_capped(
        info["damaged_steps"],
        lambda worker, step, why: f"Damaged step {step} ({worker}), skipped: {why}",
        "damaged step(s)",
    )
    if "first_nonfinite" in info:
        first = info["first_nonfinite"]
        print(
            "First non-finite: none"
            if first is None
            else printable(
                f"First non-finite: step {first['step']} ({first['mode']}) on {first['worker']}, "
                f"{first['direction']} {first['tensor']} (module {first['module']}); `smdebug why` explains"
            )
        )
    if info.get("rule_firings"):
        print(printable(f"Rule firings during training: {_firings(info['rule_firings'])}"))
    print("Modes:")
    for name, steps in info["modes"].items():
        print(f"  {name:<8} mode steps {compact_steps(steps['mode_steps'])}")
    print("Collections:")
    for name, count in info["collections"].items():
        if count:  # an empty one ("all", "default" of a run saving named collections) says nothing
            print(f"  {printable(name):<20} {count} tensor{'s' if count != 1 else ''}")
    print(f"Tensors ({len(info['tensors'])}):")
    rows = [
        [
            t["name"],
            str(t["steps"]),
            "-" if t["shape"] is None else str(tuple(t["shape"])),
            ", ".join(t["saved"]) or "-",
        ]
        for t in info["tensors"]
    ]
    if rows:
        print(
            "\n".join("  " + line for line in table(rows, ["NAME", "STEPS", "SHAPE", "SAVED"]).splitlines())
        )
    return 0


def _ranges(steps: list[int]) -> str:
    """Every step, runs of consecutive ones as "first-last": "3-6, 9"."""
    out: list[str] = []
    steps = sorted(steps)
    start = prev = steps[0]
    for step in steps[1:] + [None]:
        if step is not None and step == prev + 1:
            prev = step
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if step is not None:
            start = prev = step
    return ", ".join(out)


def _firings(firings: list[dict]) -> str:
    """``LossNotDecreasing at steps 3, 6 (worker_0)``, one part per rule and worker."""
    steps: dict[tuple[str, str], list[int]] = {}
    for f in firings:
        steps.setdefault((f["rule"], f["worker"]), []).append(f["step"])
    return "; ".join(
        f"{rule} at step{'s' if len(s) > 1 else ''} {compact_steps(sorted(set(s)))} ({worker})"
        for (rule, worker), s in steps.items()
    )
