"""Runs that hooks of this process are writing, so that a reader opened in the same process (a Trial
right after the training loop, before ``hook.close()``) first has them flush: it then sees every step
saved so far, the last one included (a hook otherwise writes a step when the next begins or at close).

The registry holds weak references only; the hook side registers, the reading side asks. Neither
imports the other."""

from __future__ import annotations

import json
import os
import threading
import weakref
from typing import Protocol


class _Flushable(Protocol):
    closed: bool

    def flush(self) -> None: ...


# `smdebug run` asks its command's hooks to say where they write (a script may make a hook of its own)
RUN_REPORT_ENV = "SMDEBUG_RUN_REPORT"
_open: list[tuple[str, weakref.ref, int]] = []  # (run key, weak ref to the hook, its training thread)
_lock = threading.Lock()


def run_key(path: str) -> str:
    """One spelling per run: local paths made absolute (symlinks resolved), URIs without a trailing /."""
    path = os.fspath(path).strip()
    if path.startswith("file://"):
        path = path[len("file://") :]
    if "://" in path:
        return path.rstrip("/")
    return os.path.realpath(os.path.expanduser(path))


def register(path: str, hook: _Flushable) -> None:
    """``hook`` writes the run at ``path`` (called from its training thread, when it starts writing)."""
    key, thread = run_key(path), threading.get_ident()
    with _lock:
        _open[:] = [e for e in _open if e[1]() is not None and e[1]() is not hook]
        _open.append((key, weakref.ref(hook), thread))
    report = os.environ.get(RUN_REPORT_ENV)
    if report:
        try:
            with open(report, "a", encoding="utf-8") as f:
                f.write(json.dumps({"out_dir": path}) + "\n")
        except OSError:
            pass  # only a note for `smdebug run`'s closing line


def flush(path: str) -> None:
    """Have the open hooks writing ``path`` write what they saved so far. Only a hook whose training
    thread is the caller's is flushed (ending its current step from another thread would race with
    training); a reader on another thread sees the steps as the hook writes them."""
    key, thread = run_key(path), threading.get_ident()
    with _lock:
        hooks = [e[1]() for e in _open if e[0] == key and e[2] == thread]
    for hook in hooks:
        if hook is not None and not hook.closed:
            hook.flush()
