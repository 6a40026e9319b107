"""The stop signal, and a hook's stop state.

The stop signal is a small JSON file, ``STOP_SIGNAL_FILE``, in a run's folder: ``smdebug rules --watch
OUT`` (or a rule configured with ``action_str="stoptraining"``, or a hook's own rule, so that every worker
of a distributed run stops) writes it, and the hook writing the run looks for it at the end of each step.
The training thread never waits on a remote store for it: a remote run's signal is read (and written) on a
thread of its own.

The workers of a distributed run see the signal at different steps (each looks on its own), and one that
stopped before the others would leave them waiting in a collective. So they stop after the same step: the
first to see it proposes one far enough ahead for the others to see it before (twice the time between two
looks, in steps, plus two), in ``STOP_STEP_FILE`` (created once: the first proposal is everyone's).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time

from smdebug.exceptions import CorruptRunError, StopTraining
from smdebug.layout import MAX_NUMBER, load_json

logger = logging.getLogger("smdebug")

STOP_SIGNAL_FILE = "smdebug_stop_training.json"
STOP_STEP_FILE = "smdebug_stop_step.json"  # the step every worker of the run stops after
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
    for relpath in (STOP_SIGNAL_FILE, STOP_STEP_FILE):
        if store.exists(relpath):
            store.remove(relpath)  # (fs.rm would expand a path's "[1]" as a glob)


def agree_on_stop_step(out_dir, proposal: int) -> int:
    """The step every worker of the run stops after: the first proposal written to the run, or this one."""
    store = _store(out_dir)
    data = json.dumps({"step": int(proposal)}).encode()
    if store.is_local:  # created whole, once: a link to a complete file fails if one is there
        temp = store.path(f"{STOP_STEP_FILE}.{os.getpid()}.{threading.get_ident()}")
        with open(temp, "wb") as f:
            f.write(data)
        try:
            os.link(temp, store.path(STOP_STEP_FILE))
        except FileExistsError:
            pass
        finally:
            os.remove(temp)
    elif not store.exists(STOP_STEP_FILE):  # (two writing at once: the last write is everyone's)
        store.write_bytes(STOP_STEP_FILE, data)
    step = load_json(store.read_bytes(STOP_STEP_FILE)).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else proposal


class StopSignal:
    """A hook's stop state: why training should stop (a rule that fired, or the signal found in the run),
    and the watch for the run's signal (none in a dry run)."""

    def __init__(self, out_dir: str, dry_run: bool, hook=None):
        self.out_dir = out_dir
        self.dry_run = dry_run
        self.hook = hook  # its step and number of workers (a distributed run's workers stop together)
        self.stop: StopTraining | None = None
        self.raised = False
        self._requested = False
        self._coming: StopTraining | None = None  # the stop of a distributed run, after step _stop_after
        self._stop_after = -1
        self._step_seconds = 0.0  # (a recent step's time: how far ahead the workers stop)
        self._step_seen = (-1, 0.0)
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
        """Training should stop (a rule fired); with ``write_signal`` every worker of the run is told (and
        they stop together)."""
        if self.stop is not None or self._coming is not None or self._requested:
            return
        self._requested = True
        logger.warning("smdebug: %s", stop)
        together = write_signal and self._workers() > 1
        if not together:
            self.stop = stop
        if write_signal:
            if self._local:
                self._write(stop, together)
            else:
                _in_background(self._write, stop, together)

    def _write(self, stop: StopTraining, together: bool = False) -> None:
        try:
            write_stop_signal(self.out_dir, stop.rule_name, stop.step, stop.reason)
            if together:
                self._agree(stop)
                self._coming = stop
        except Exception as exc:
            logger.warning("smdebug: could not write the stop signal: %s", exc)
            if together:
                self.stop = stop  # it stops at once, alone

    def _workers(self) -> int:
        """How many workers must agree on the step to stop after (1: none, or the plugin does it)."""
        if self.hook is None or self.hook.stops_together:
            return 1
        try:
            return int(self.hook.num_workers())
        except Exception:
            return 1

    def _agree(self, stop: StopTraining) -> None:
        """The step this worker stops after, with the run's other workers."""
        step = self.hook.step
        poll = LOCAL_SIGNAL_CHECK_SECONDS if self._local else REMOTE_SIGNAL_CHECK_SECONDS
        ahead = 2 + (math.ceil(2 * poll / self._step_seconds) if self._step_seconds > 0 else 10)
        self._stop_after = agree_on_stop_step(self._store or self.out_dir, step + ahead)
        logger.warning("smdebug: every worker of the run stops after step %d (%s)", self._stop_after, stop)

    def check(self) -> None:
        """Look for the stop signal: on a local disk at a step end at most every 50 ms; on a remote store
        every few seconds, on a thread of its own (what it found is seen at the next step end)."""
        if self.stop is not None or self.dry_run:
            return
        now = time.monotonic()
        if self.hook is not None:  # (the time of a step, for how far ahead a distributed run stops)
            step, when = self._step_seen
            if self.hook.step > step >= 0:
                self._step_seconds = (now - when) / (self.hook.step - step)
            self._step_seen = (self.hook.step, now)
        if self._coming is not None:
            if self.hook.step >= self._stop_after:
                self.stop = self._coming
            return
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
        if signal is not None and self.stop is None and self._coming is None:
            reason = signal.get("reason") or "stop signal"
            stop = StopTraining(signal["rule"], signal["step"], reason)
            stop.source = "signal"
            logger.warning("smdebug: stop signal found in %s: %s", self.out_dir, stop)
            if self._workers() > 1:
                try:
                    self._agree(stop)
                except Exception as exc:  # this worker stops at once
                    logger.debug("smdebug: could not agree on the step to stop after: %s", exc)
                    self._stop_after = -1
                self._coming = stop
            else:
                self.stop = stop

    def pending(self) -> StopTraining | None:
        """The StopTraining to raise, once."""
        if self.stop is None or self.raised:
            return None
        self.raised = True
        return self.stop
