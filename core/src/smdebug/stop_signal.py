"""The stop signal, and a hook's stop state.

The stop signal is a small JSON file, ``STOP_SIGNAL_FILE``, in a run's folder: ``smdebug rules --watch
OUT`` (or a rule configured with ``action_str="stoptraining"``, or a hook's own rule, so that every worker
of a distributed run stops) writes it, and the hook writing the run looks for it at the end of each step.
The training thread never waits on a remote store for it: a remote run's signal is read (and written) on a
thread of its own.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from smdebug.exceptions import CorruptRunError, StopTraining
from smdebug.layout import MAX_NUMBER, load_json

logger = logging.getLogger("smdebug")

STOP_SIGNAL_FILE = "smdebug_stop_training.json"
# How often a hook looks for the stop signal: on a local disk at the end of a step at most this often (a
# stat is a system call, which costs a fast training loop ~20 us a step), on a remote store in the background.
LOCAL_SIGNAL_CHECK_SECONDS = 0.05
REMOTE_SIGNAL_CHECK_SECONDS = 5.0


def _store(out_dir):
    from smdebug import plugins

    return out_dir if hasattr(out_dir, "write_bytes") else plugins.open_store(out_dir)


def _is_local(out_dir: str) -> bool:
    import fsspec

    return fsspec.core.split_protocol(out_dir)[0] in (None, "file", "local")


def _in_background(fn, *args) -> threading.Thread:
    thread = threading.Thread(target=fn, args=args, name="smdebug-stop-signal", daemon=True)
    thread.start()
    return thread


def write_stop_signal(out_dir, rule_name: str, step: int, reason: str = "") -> None:
    """Ask the hook writing the run at ``out_dir`` (a path, URI or Store) to stop training."""
    signal = {"rule": rule_name, "step": int(step), "reason": reason, "time": time.time()}
    _store(out_dir).write_bytes(STOP_SIGNAL_FILE, json.dumps(signal).encode())
    logger.info("smdebug: stop signal written to %s (rule %s, step %d)", out_dir, rule_name, step)


def read_stop_signal(out_dir) -> dict | None:
    """The stop signal of the run at ``out_dir``, or None when there is none."""
    store = _store(out_dir)
    if not store.exists(STOP_SIGNAL_FILE):
        return None
    try:
        signal = load_json(store.read_bytes(STOP_SIGNAL_FILE))
    except (OSError, ValueError, CorruptRunError):
        signal = None
    return _checked(signal)


def _checked(signal) -> dict:
    """The signal with its fields of the expected types: anyone can write the file, and a bad value
    (``"step": null``, a list, a huge number) must not raise in the training thread. The file's presence
    is what asks for the stop."""
    if not isinstance(signal, dict):
        signal = {}
    step = signal.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not -1 <= step < MAX_NUMBER:
        step = -1
    rule, reason = signal.get("rule"), signal.get("reason")
    return {
        **signal,
        "rule": rule[:200] if isinstance(rule, str) and rule else "unknown",
        "step": step,
        "reason": reason[:1000] if isinstance(reason, str) else "",
    }


def clear_stop_signal(out_dir) -> None:
    store = _store(out_dir)
    if store.exists(STOP_SIGNAL_FILE):
        store.fs.rm(store.path(STOP_SIGNAL_FILE))


class StopSignal:
    """A hook's stop state: why training should stop (a rule that fired, or the signal found in the run),
    and the watch for the run's signal (none in a dry run)."""

    def __init__(self, out_dir: str, dry_run: bool):
        self.out_dir = out_dir
        self.dry_run = dry_run
        self.stop: StopTraining | None = None
        self.raised = False
        self._last_check = 0.0
        self._local = _is_local(out_dir)
        self._store = None  # the run's store, opened once for the checks
        self._path: str | None = None  # the signal file's local path (local runs)
        self._checking: threading.Thread | None = None  # a remote check in flight
        self._cleared = dry_run
        if self._local:
            self._clear_old()

    def _clear_old(self) -> None:
        """A signal left by an earlier, interrupted run in this folder is not for us."""
        self._cleared = True
        try:
            clear_stop_signal(self._store or self.out_dir)
        except Exception as exc:
            logger.debug("smdebug: could not look for an old stop signal: %s", exc)

    def request(self, stop: StopTraining, write_signal: bool) -> None:
        """Training should stop (a rule fired); with ``write_signal`` every worker of the run is told."""
        if self.stop is not None:
            return
        self.stop = stop
        logger.warning("smdebug: %s", stop)
        if write_signal:
            if self._local:
                self._write(stop)
            else:
                _in_background(self._write, stop)

    def _write(self, stop: StopTraining) -> None:
        try:
            write_stop_signal(self.out_dir, stop.rule_name, stop.step, stop.reason)
        except Exception as exc:
            logger.warning("smdebug: could not write the stop signal: %s", exc)

    def check(self) -> None:
        """Look for the stop signal: on a local disk at a step end at most every 50 ms; on a remote store
        every few seconds, on a thread of its own (what it found is seen at the next step end)."""
        if self.stop is not None or self.dry_run:
            return
        now = time.monotonic()
        if self._local:
            if now - self._last_check >= LOCAL_SIGNAL_CHECK_SECONDS:
                self._last_check = now
                self._look()
            return
        if self._checking is not None and self._checking.is_alive():
            return  # the last check still waits on the store
        if now - self._last_check < REMOTE_SIGNAL_CHECK_SECONDS:
            return
        self._last_check = now
        self._checking = _in_background(self._look)

    def _look(self) -> None:
        try:
            if self._store is None:
                self._store = _store(self.out_dir)
            if not self._cleared:
                self._clear_old()
                return
            if self._path is None and self._store.is_local:
                self._path = self._store.path(STOP_SIGNAL_FILE)
            if self._path is not None and not os.path.exists(self._path):
                return  # every step on a local disk: one stat, no Store call
            signal = read_stop_signal(self._store)
        except Exception as exc:
            logger.debug("smdebug: could not look for the stop signal: %s", exc)
            return
        if signal is not None and self.stop is None:
            reason = signal.get("reason") or "stop signal"
            stop = StopTraining(signal["rule"], signal["step"], reason)
            stop.source = "signal"
            self.stop = stop
            logger.warning("smdebug: stop signal found in %s: %s", self.out_dir, stop)

    def pending(self) -> StopTraining | None:
        """The StopTraining to raise, once."""
        if self.stop is None or self.raised:
            return None
        self.raised = True
        return self.stop
