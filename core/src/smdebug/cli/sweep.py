"""``smdebug rules`` over many runs: tasks on Dask (or in this process), one results table or JSON."""

from __future__ import annotations

import json
import os
import sys

from smdebug.cli._common import EXIT_ERROR, EXIT_FIRED, rules_progress, steps_text

DEFAULT_LIVE_TIMEOUT = 60.0  # seconds without a new step before a live run stops being followed


def run_many(args) -> int:
    from smdebug.rules import sweep

    runs = sweep.find_runs(args.runs)
    rules = [(name, params) for name, params in args.rules] if args.rules else None
    client, workers = None, None
    if args.scheduler:
        client = sweep.connect(args.scheduler)
    else:
        workers = args.workers if args.workers is not None else sweep.default_workers()
        workers = min(workers, max(len(runs), 1))
        if workers > 1 and not sweep.dask_available():
            print(
                f"smdebug rules: Dask is not installed: evaluating the {len(runs)} runs in this process "
                f"({sweep.DASK_HINT} for parallel workers)",
                file=sys.stderr,
            )
            workers = None
    timeout = args.timeout if args.timeout is not None or args.watch else DEFAULT_LIVE_TIMEOUT
    try:
        with rules_progress() as progress:
            task = progress.add_task(f"{len(runs)} runs", total=None)
            rows, skipped = sweep.evaluate_rows(
                runs,
                rules,
                client=client,
                workers=workers,
                baseline=args.baseline,
                start_step=args.start_step,
                end_step=args.end_step,
                steps_per_task=args.steps_per_task,
                timeout=timeout,
                stop_training=args.watch,
                progress=lambda done, total: progress.update(task, completed=done, total=total),
            )
    finally:
        if client is not None:
            client.close()
    if args.json:
        print(json.dumps({"results": rows, "skipped_rules": skipped}))
    else:
        _print_table(rows, skipped, show_all=args.all)
    statuses = {row["status"] for row in rows}
    if "fired" in statuses:
        return EXIT_FIRED
    return EXIT_ERROR if "error" in statuses else 0


def _params_text(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "-"


def _print_table(rows: list[dict], skipped: dict, show_all: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    runs = list(dict.fromkeys(row["run"] for row in rows))
    # an ok row with a note (damaged steps skipped, a live run not followed to its end) is shown too
    shown = rows if show_all else [row for row in rows if row["status"] in ("fired", "error") or row["note"]]
    shown = shown if show_all else [row for row in shown if row["status"] != "no data"]
    # runs under one folder are named relative to it
    parent = os.path.commonprefix([r.rsplit("/", 1)[0] + "/" for r in runs]).rsplit("/", 1)[0]
    where = f" in {parent}" if parent and len(runs) > 1 else ""
    strip = len(parent) + 1 if where else 0
    table = Table(title=f"Rules on {len(runs)} runs{where}", title_justify="left")
    for column in ("Run", "Rule", "Parameters", "Result", "Fired at steps", "Tensors", "Details"):
        table.add_column(column, overflow="fold")
    style = {
        "fired": "[bold red]FIRED[/bold red]",
        "error": "[yellow]error[/yellow]",
        "skipped": "[dim]skipped[/dim]",
        "ok": "[green]ok[/green]",
        "no data": "[cyan]no data[/cyan]",
    }
    for row in shown:
        details = row["error"] if row["status"] == "error" else row["reason"]
        if row["note"]:
            details = f"{details} ({row['note']})" if details else row["note"]
        if where:
            details = details.replace(parent + "/", "")
        table.add_row(
            str(row["run"])[strip:],
            row["rule"] if isinstance(row["rule"], str) else "-",
            _params_text(row["parameters"]),
            style[row["status"]],
            steps_text(row["fired_steps"]),
            ", ".join(row["tensors"]) or "-",
            details,
        )
    if shown:
        console.print(table)
    fired = [row for row in rows if row["status"] == "fired"]
    errors = [row for row in rows if row["status"] == "error"]
    rules = [r for r in dict.fromkeys(row["rule"] for row in rows) if r is not None]
    summary = (
        f"{len(runs)} runs x {len(rules)} rules: {len(fired)} fired in "
        f"{len({row['run'] for row in fired})} runs, {len(errors)} with errors"
    )
    nodata = sum(row["status"] == "no data" for row in rows)
    if nodata:
        summary += f", {nodata} with nothing to check (no data)"
    if not show_all:
        summary += "; every other (run, rule) is ok or skipped (--all lists them)"
    console.print(summary)
    if skipped:
        console.print(f"skipped (need parameters): {', '.join(skipped)}")
