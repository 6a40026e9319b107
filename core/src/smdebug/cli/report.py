"""``smdebug report RUN [-o report.html] [--watch]``: the run as one self-contained HTML page.

Loss and metric curves per mode with rule firings marked, every layer's gradient norm and weight-update
ratio over steps as heatmaps, the built-in rules' results, the run's workers, collections, tensors and
unsaved steps. Nothing on the page is fetched from the network. With ``--watch`` the page is regenerated
while the run is written and reloads itself, until training ends. See ``smdebug.report``.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time

from smdebug.exceptions import SMDebugError, SMDebugValueError


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a run's self-contained HTML report (curves, gradient heatmaps, rules)",
        description=__doc__.split("\n\n")[1].replace("``", ""),  # reST markup: not for a terminal
    )
    parser.add_argument("run", metavar="RUN", help="a run's folder or URI (local, s3://, any fsspec path)")
    parser.add_argument(
        "-o",
        "--output",
        default="report.html",
        help="the HTML file to write, a local path or any fsspec URI (default report.html)",
    )
    parser.add_argument(
        "--reduction",
        default=None,
        help="what the gradient heatmap shows: a reduction such as l2, abs_max, mean (default: l2 "
        "where gradients were saved as values or l2 norms, else the reduction they saved)",
    )
    parser.add_argument("--no-rules", action="store_true", help="do not evaluate the built-in rules")
    parser.add_argument("--watch", action="store_true", help="regenerate the page while the run is written")
    parser.add_argument(
        "--interval", type=float, default=5.0, help="with --watch: seconds between regenerations (default 5)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="with --watch: stop after this many seconds without a new step (default: until training ends)",
    )
    limits = parser.add_argument_group("page size")
    limits.add_argument("--max-points", type=int, default=2000, help="saved steps per curve (default 2000)")
    limits.add_argument("--max-steps", type=int, default=400, help="heatmap columns (default 400)")
    limits.add_argument("--max-cells", type=int, default=400_000, help="cells per heatmap (default 400000)")
    limits.add_argument("--max-curves", type=int, default=100, help="line charts, losses first (default 100)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from smdebug.cli._common import open_trial, reach_trial
    from smdebug.report import Limits, check_output, render, snapshot, write_page, write_report
    from smdebug.store import is_transient

    for name in ("interval", "max_points", "max_steps", "max_cells", "max_curves"):
        if getattr(args, name) <= 0:
            raise SMDebugValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.timeout is not None and args.timeout < 0:
        raise SMDebugValueError(f"--timeout must be >= 0, got {args.timeout}")
    output = check_output(args.output)  # before reading the run (or waiting for one that has not started)
    limits = Limits(
        max_points=args.max_points,
        max_steps=args.max_steps,
        max_cells=args.max_cells,
        max_curves=args.max_curves,
    )
    options = {"reduction": args.reduction, "rules": not args.no_rules, "limits": limits}
    if not args.watch:
        path = write_report(open_trial(args.run), args.output, **options)
        print(f"Report written to {path}")
        return 0
    trial = reach_trial(args.run, missing_ok=True)
    last_change, seen, data, outage = time.monotonic(), None, None, None
    try:
        with _sigterm_interrupts():
            _wait_for_run(trial, args, output)
            while True:
                try:
                    trial.maybe_refresh(force=True)
                    ended = trial.training_ended()
                    steps = trial.steps(show_incomplete_steps=True)
                    # (and the steps every worker wrote: a slower worker completing one shows it)
                    state = (len(steps), steps[-1] if steps else None, len(trial.steps()), ended)
                    if state != seen:
                        data = snapshot(trial, **options)
                        write_page(render(data, 0 if ended else args.interval), output)
                        print(
                            f"{time.strftime('%H:%M:%S')} report written to {output} ({len(steps)} steps)",
                            file=sys.stderr,
                        )
                        seen, last_change = state, time.monotonic()
                    outage = None
                except Exception as exc:  # a remote store that does not answer: watched on, said once
                    if isinstance(exc, SMDebugError) or trial.store.is_local or not is_transient(exc):
                        raise
                    if outage is None:
                        print(
                            f"smdebug report: cannot read the run ({trial.store.describe(exc)}); retrying "
                            f"every {args.interval:g} s",
                            file=sys.stderr,
                        )
                    outage, ended = exc, False
                if ended:
                    print(f"Training ended; final report written to {output}")
                    return 0
                if args.timeout is not None and time.monotonic() - last_change > args.timeout:
                    _final(data, args, output)  # a page that no longer reloads itself
                    print(f"Stopped watching: no new step for {args.timeout:g} s; report written to {output}")
                    return 0
                time.sleep(args.interval)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the page left must not go on reloading itself
        _final(data, args, output)
        if data is None:
            print(f"Stopped watching (interrupted) before the run wrote a step; {output} says so")
        else:
            print(f"Stopped watching (interrupted); report written to {output}")
        return 130


def _final(data, args, output: str) -> None:
    """The page as last read, no longer reloading itself (rendered again: the run is not read, it may be
    unreachable); before the run's first step, the waiting page saying that watching stopped."""
    from smdebug.report import render, write_page
    from smdebug.report.page import waiting_page

    write_page(waiting_page(args.run) if data is None else render(data), output)


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM (a ``kill``, a container stopping) ends the watch as Ctrl-C does; outside the main thread,
    where no handler can be set, SIGTERM keeps its own."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _wait_for_run(trial, args, output: str) -> None:
    """A run that has not started yet: wait for its first step (or --timeout), the page saying so and
    reloading itself meanwhile (a browser opened on it at once would otherwise find no file, for good)."""
    from smdebug.report import write_page
    from smdebug.report.page import waiting_page

    start = time.monotonic()
    waiting = False
    while not trial.steps(show_incomplete_steps=True) and not trial.training_ended():
        if not waiting:
            waiting = bool(write_page(waiting_page(args.run, args.interval), output))
        if args.timeout is not None and time.monotonic() - start > args.timeout:
            write_page(waiting_page(args.run), output)
            raise SMDebugValueError(f"{args.run}: no smdebug run appeared within {args.timeout:g} s")
        time.sleep(min(args.interval, 1.0))
        trial.refresh()
