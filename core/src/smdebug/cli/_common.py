"""What the analysis subcommands share: opening a run, parsing modes, compact step lists."""

from __future__ import annotations

import difflib

from smdebug.exceptions import SMDebugValueError
from smdebug.modes import ModeKeys, to_mode


def open_trial(path: str):
    """The Trial at path; a clear error when nothing there looks like an smdebug run."""
    from smdebug.trials import create_trial

    trial = create_trial(path)
    if not trial.steps(show_incomplete_steps=True) and not trial.collections():
        if not trial.store.fs.exists(trial.store.root):
            raise SMDebugValueError(f"{path}: no such file or directory")
        raise SMDebugValueError(f"{path}: no smdebug run found (no index or collections files)")
    return trial


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


def compact_steps(steps: list[int], limit: int = 8) -> str:
    """ "0, 10, 20" or "0, 10, 20, ..., 190 (20 steps)" for long lists."""
    if not steps:
        return "-"
    if len(steps) <= limit:
        return ", ".join(map(str, steps))
    head = ", ".join(map(str, steps[:3]))
    return f"{head}, ..., {steps[-1]} ({len(steps)} steps)"


def table(rows: list[list[str]], header: list[str]) -> str:
    """Left-aligned plain-text columns."""
    rows = [header, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
