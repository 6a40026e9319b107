"""``smdebug diff RUN_A RUN_B`` (or ``smdebug diff RUN --workers W1 W2``): where two runs, or two workers
of one run, first part.

Prints the first step and tensor that differ beyond ``--rtol``/``--atol``, then each tensor's first
divergence, and what could not be compared. Exit code: 1 when they differ, 0 when they agree, 2 on an
error. See ``smdebug.trials.diff``.
"""

from __future__ import annotations

import json

from smdebug.cli._common import open_trial, table
from smdebug.exceptions import SMDebugValueError

EXIT_DIFFER = 1


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="find where two runs (or two workers of one run) first differ (exit code 1 when they do)",
        description=__doc__.split("\n\n")[1].replace("``", ""),  # reST markup: not for a terminal
    )
    parser.add_argument(
        "run_a", metavar="RUN_A", help="a run's folder or URI (local, s3://, any fsspec path)"
    )
    parser.add_argument(
        "run_b", metavar="RUN_B", nargs="?", help="the other run (default with --workers: RUN_A itself)"
    )
    parser.add_argument(
        "--workers", nargs=2, metavar=("W1", "W2"), help="compare worker W1 (of RUN_A) with W2 (of RUN_B)"
    )
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    parser.add_argument("--atol", type=float, default=1e-8, help="absolute tolerance (default 1e-8)")
    parser.add_argument("--collection", help="compare only the tensors of this collection")
    parser.add_argument("--regex", help="compare only the tensors whose name matches this regex")
    parser.add_argument("--all", action="store_true", help="list every tensor, not only those that differ")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.set_defaults(func=run)


def run(args) -> int:
    from smdebug.trials.divergence import AGREES, DIFFERS, compare

    if args.run_b is None and args.workers is None:
        raise SMDebugValueError("give two runs (RUN_A RUN_B), or one run and --workers W1 W2")
    trial_a = open_trial(args.run_a)
    trial_b = trial_a if args.run_b is None else open_trial(args.run_b)
    result = compare(
        trial_a,
        trial_b,
        rtol=args.rtol,
        atol=args.atol,
        workers=tuple(args.workers) if args.workers else None,
        collection=args.collection,
        regex=args.regex,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    if not result.compared:
        raise SMDebugValueError(f"nothing both sides saved could be compared: {_why_not(result.rows)}")
    if args.json:
        return EXIT_DIFFER if result.differs else 0
    sides = f"{result.a} vs {result.b}" + (
        f" (workers {args.workers[0]} vs {args.workers[1]})" if args.workers else ""
    )
    first = result.first
    # one row per tensor and pair of workers: with several pairs, rows name theirs and counts are of tensors
    pairs = list(dict.fromkeys(r.workers for r in result.rows if r.workers))
    several = len(pairs) > 1

    def on(r) -> str:
        return f" ({r.workers})" if several and r.workers else ""

    agreed = len({r.tensor for r in result.rows if r.status == AGREES})
    on_pairs = f", each on {len(pairs)} worker pairs ({', '.join(pairs)})" if several else ""
    if first is None:
        print(
            f"{sides}: agree (rtol={args.rtol:g}, atol={args.atol:g}): {agreed} tensor(s) compared{on_pairs}"
        )
    else:
        mode = f" ({first.mode} step {first.mode_step})" if first.mode not in (None, "GLOBAL") else ""
        where = f" on {first.workers}" if several else ""
        print(f"{sides}: first differ at step {first.step}{mode}, tensor {first.tensor}{where}")
        print(
            f"  {first.compared}: a={_text(first.a)} b={_text(first.b)} max |a-b|={_text(first.max_abs_diff)}"
        )
        if first.detail:
            print(f"  {first.detail}")
    shown = [r for r in result.rows if args.all or r.status == DIFFERS]
    if shown:
        rows = [
            [
                r.tensor,
                *([r.workers or "-"] if several else []),
                r.status,
                "-" if r.step is None else str(r.step),
                r.mode or "-",
                r.compared or "-",
                _text(r.max_abs_diff),
                str(r.steps_compared),
            ]
            for r in sorted(shown, key=lambda r: (r.step is None, r.step or 0))
        ]
        print()
        headers = ["TENSOR", *(["WORKERS"] if several else []), "STATUS", "FIRST STEP", "MODE", "COMPARED"]
        print(table(rows, [*headers, "MAX |A-B|", "STEPS"]))
    not_compared = [r for r in result.rows if r.status not in (AGREES, DIFFERS)]
    partly = [r for r in result.rows if r.status in (AGREES, DIFFERS) and r.not_compared]
    if not_compared or partly:
        print()
        counts = len({r.tensor for r in not_compared}), len({r.tensor for r in partly})
        print(f"Not compared ({counts[0]} tensor(s)), or compared in part ({counts[1]}):")
        for r in [*not_compared, *partly]:
            print(f"  {r.tensor}{on(r)}: {r.status}: {r.not_compared}")
    for note in result.notes:
        print(note)
    if first is None and not args.all:
        print(f"{agreed} tensor(s) agree{on_pairs}; --all lists them")
    return EXIT_DIFFER if result.differs else 0


def _why_not(rows) -> str:
    """Why no tensor was compared, in one line: how many tensors for each reason, a few names each."""
    reasons: dict[str, list[str]] = {}
    for r in rows:
        reason = (
            r.not_compared.split(": ", 1)[0]
            if r.not_compared.startswith("saved only")
            else (
                "no step saved by both" if "no step saved by both" in r.not_compared else "nothing comparable"
            )
        )
        reasons.setdefault(reason, []).append(r.tensor)
    return "; ".join(
        f"{len(names)} tensor(s) {reason} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        for reason, names in reasons.items()
    )


def _text(value) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}" if isinstance(value, float) else str(value)
