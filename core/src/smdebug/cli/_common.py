"""What the analysis subcommands share: opening a run, parsing modes, compact step lists."""

from __future__ import annotations

import difflib
import os

from smdebug.exceptions import SMDebugError, SMDebugValueError, did_you_mean
from smdebug.modes import ModeKeys, to_mode
from smdebug.store import probe, reach_timeout

# How long the CLI waits for a remote store's first answer before saying it is unreachable (seconds).
EXIT_FIRED = 1  # `smdebug rules`: a rule fired
EXIT_ERROR = 2  # `smdebug rules`: a rule or a run could not be evaluated
REACH_TIMEOUT = reach_timeout()


def open_trial(path: str):
    """The Trial at path; a clear error when nothing there looks like an smdebug run, or when the store
    cannot be reached (no answer, no credentials): one line naming the URI and the cause, in bounded time."""
    trial = reach_trial(path)
    if not trial.steps(show_incomplete_steps=True) and not trial.collections():
        from smdebug.layout import no_run_here

        raise SMDebugValueError(no_run_here(trial.store, path))
    return trial


def reach_trial(path: str, missing_ok: bool = False):
    """create_trial(path), after checking within REACH_TIMEOUT that a remote store answers; its errors
    (unreachable endpoint, no credentials, ...) become one line naming the URI and the cause."""
    from smdebug import plugins
    from smdebug.trials import create_trial

    os.environ.setdefault("AWS_MAX_ATTEMPTS", "2")  # a command, not training: fail soon, say why
    store = plugins.open_store(path)
    if not store.is_local:
        _probe(store, missing_ok)
    try:
        return create_trial(path, missing_ok=True)  # the commands say it themselves
    except SMDebugError:
        raise
    except Exception as exc:  # the storage client's own errors (botocore, aiohttp, ...)
        raise SMDebugValueError(f"{store.uri}: cannot read the run: {store.describe(exc)}") from None


def _probe(store, missing_ok: bool = False) -> None:
    """List the run's folder once, off the main thread and with a deadline: an unreachable endpoint or
    missing credentials become one clear error instead of minutes of retries and a traceback."""
    result = probe(store, REACH_TIMEOUT)
    if isinstance(result, TimeoutError):
        raise SMDebugValueError(f"{store.uri}: cannot read the run: no answer within {REACH_TIMEOUT:g} s")
    if isinstance(result, FileNotFoundError):
        if missing_ok:
            return
        raise SMDebugValueError(f"{store.uri}: no such file or directory")
    if isinstance(result, BaseException):
        raise SMDebugValueError(f"{store.uri}: cannot read the run: {store.describe(result)}")


def parse_mode(value: str | None) -> ModeKeys | None:
    if value is None:
        return None
    try:
        return to_mode(value.upper() if isinstance(value, str) else value)
    except ValueError as exc:
        raise SMDebugValueError(str(exc)) from None


def add_mode_argument(parser) -> None:
    parser.add_argument(
        "--mode", help="TRAIN, EVAL, PREDICT or GLOBAL (steps are then that mode's steps)", default=None
    )


def require_tensor(trial, name: str) -> None:
    if not trial.has_tensor(name):
        close = difflib.get_close_matches(name, trial.tensor_names(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `smdebug ls` lists the saved tensors"
        raise SMDebugValueError(f"tensor {name!r} was not saved in {trial.path}{hint}")


def require_worker(trial, worker: str | None) -> str | None:
    """The run's name of ``worker`` (a TensorFlow device also in its file-name form), or one line naming
    the nearest worker the run has; None stays None (the first worker)."""
    if worker is None:
        return None
    from smdebug.layout import worker_from_file_name

    workers, name = trial.workers(), worker_from_file_name(worker)
    if name in workers:
        return name
    hint = did_you_mean(worker, workers)
    raise SMDebugValueError(
        f"worker {worker!r} is not in the run{hint} (workers: {', '.join(workers) or '-'})"
    )


def compact_steps(steps: list[int], limit: int = 8) -> str:
    """ "0, 10, 20" or "0, 10, 20, ..., 190 (20 steps)" for long lists."""
    if not steps:
        return "-"
    if len(steps) <= limit:
        return ", ".join(map(str, steps))
    head = ", ".join(map(str, steps[:3]))
    return f"{head}, ..., {steps[-1]} ({len(steps)} steps)"


# A column is padded to at most this width: a longer cell is printed whole, unpadded (a 10,000-character
# name must not pad every other row to it).
MAX_COLUMN_WIDTH = 60


def printable(text) -> str:
    """text with control characters (and Unicode format characters such as bidi overrides) escaped,
    so that a name from a run cannot move the cursor, recolour the terminal or forge a table row."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char) or (
        f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    )


def table(rows: list[list[str]], header: list[str]) -> str:
    """Left-aligned plain-text columns, control characters escaped, padded to at most MAX_COLUMN_WIDTH."""
    rows = [header, *([printable(c) for c in r] for r in rows)]
    widths = [min(max(len(r[i]) for r in rows), MAX_COLUMN_WIDTH) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def rules_progress():
    """The progress bar of `smdebug rules` (on a terminal only)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn("[bold]rules[/bold] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=console.is_terminal,
        disable=not console.is_terminal,
    )


def steps_text(steps: list[int], limit: int = 6) -> str:
    """The steps a rule fired at, the first few of many."""
    if not steps:
        return "-"
    if len(steps) <= limit:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:limit]))}, ... ({len(steps)} steps)"
