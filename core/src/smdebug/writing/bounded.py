"""Calls the training thread must not wait on for long: a storage call bounded in time, and work done at
interpreter exit (before the thread pools that remote stores upload with shut down)."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

from smdebug.writing.settings import close_timeout_from_env


def at_exit(fn, *args) -> None:
    """Run fn(*args) at interpreter exit, before thread pools shut down (s3fs needs them to upload)."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError
        register(fn, *args)
    except RuntimeError:  # no such hook, or the interpreter is already shutting down
        atexit.register(fn, *args)


def run_bounded(fn: Callable[[], object], timeout: float | None = None) -> None:
    """Run fn on a thread of its own and wait for it at most ``timeout`` seconds (default the close
    timeout): for a storage call made from the training thread. Its errors are raised here."""
    errors: list[BaseException] = []

    def call():
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=call, name="smdebug-storage-call", daemon=True)
    thread.start()
    timeout = close_timeout_from_env() if timeout is None else timeout
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"the store did not answer within {timeout:g} s")
    if errors:
        raise errors[0]
