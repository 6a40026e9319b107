"""The run's record of the rules that fired during training: ``rules/<worker>.json``, one file per worker
(a folder smdebug 1.0's reader never lists), written by the in-training rule runner at each firing and read
by ``Trial.rule_firings()``, ``smdebug ls`` and the report. Like the stop signal, a record the rules leave
in the run, kept out of the rules package, which never writes (data flows one way)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING

from smdebug.layout import MAX_NUMBER, load_json

if TYPE_CHECKING:
    from smdebug.hook import BaseHook

logger = logging.getLogger("smdebug")

# The run's record of in-training firings: one file per worker, holding at most MAX_FIRINGS of them (the
# first ones; a rule that keeps firing would otherwise grow it every step) and how many more there were.
FIRINGS_DIR = "rules"
MAX_FIRINGS = 500
MAX_REASON = 1000


def firings_path(worker: str) -> str:
    return f"{FIRINGS_DIR}/{worker}.json"


def decode_firings(data: bytes, source: str = "<rule firings>") -> list[dict]:
    """A worker's firings file as a list of dicts (rule, step, mode, mode_step, reason (also as message),
    actions, time, worker); CorruptRunError naming ``source`` when it is not one (anyone can write a run's files)."""
    try:
        record = load_json(data)
        worker = record.get("worker")
        firings = []
        for item in record["firings"][:MAX_FIRINGS]:
            step, mode_step = item["step"], item.get("mode_step")
            if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < MAX_NUMBER:
                raise ValueError(f"step {step!r} is not a step")
            if mode_step is not None and not (isinstance(mode_step, int) and 0 <= mode_step < MAX_NUMBER):
                raise ValueError(f"mode_step {mode_step!r} is not a step")
            when = item.get("time")
            firings.append(
                {
                    "rule": _text(item["rule"], 200) or "unknown",
                    "step": step,
                    "mode": _text(item.get("mode"), 20) or None,
                    "mode_step": mode_step,
                    "reason": _text(item.get("reason"), MAX_REASON),
                    "message": _text(item.get("reason"), MAX_REASON),  # the same: the condition's message
                    "actions": [_text(a, 40) for a in item.get("actions") or []][:8],
                    "time": float(when)
                    if isinstance(when, (int, float)) and not isinstance(when, bool)
                    else None,
                    "worker": _text(worker, 200) or None,
                }
            )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        from smdebug.exceptions import CorruptRunError

        raise CorruptRunError(f"{source}: malformed rule firings file: {type(exc).__name__}: {exc}") from None
    return firings


def _text(value, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{type(value).__name__} where text was expected")
    return value[:limit]


class FiringsRecord:
    """The firings of a hook's rules, written to the run at each firing (the whole file, atomically: a
    reader sees the old list or the new one). Only a firing costs anything. On a local disk the file is
    written at once; on a remote store on a thread of its own, so the training thread never waits on it."""

    def __init__(self, hook: BaseHook):
        self.hook = hook
        self.items: list[dict] = []
        self.more = 0  # firings beyond MAX_FIRINGS, counted only
        self._lock = threading.Lock()
        self._fired = 0  # firings so far (the version of the list)
        self._written = 0  # the version last written
        self._thread: threading.Thread | None = None
        self._store = None
        self._earlier: list[dict] = []  # a resumed run's firings from before this hook

    def add(self, rule: str, step: int, reason: str, actions) -> None:
        hook = self.hook
        with self._lock:
            if len(self.items) < MAX_FIRINGS:
                mode = getattr(hook, "mode", None)
                self.items.append(
                    {
                        "rule": rule[:200],
                        "step": int(step),
                        "mode": getattr(mode, "name", None),
                        "mode_step": int(hook.mode_step) if hook.last_saved_step == step else None,
                        "reason": str(reason)[:MAX_REASON],
                        "actions": sorted(a for a in actions if isinstance(a, str)),
                        "time": time.time(),
                    }
                )
            else:
                self.more += 1
            self._fired += 1
        if not hook.writing:
            return
        if self._local():
            self._write()
        elif self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._write, name="smdebug-rule-firings", daemon=True)
            self._thread.start()

    def _local(self) -> bool:
        import fsspec

        return fsspec.core.split_protocol(self.hook.out_dir)[0] in (None, "file", "local")

    def _write(self) -> None:
        """Write the latest list until none newer awaits (a firing during a remote write is caught up)."""
        from smdebug import plugins

        path = firings_path(self.hook.worker)
        while True:
            with self._lock:
                version = self._fired
                if version == self._written:
                    return
                items = list(self.items)
            try:
                if self._store is None:
                    self._store = plugins.open_store(self.hook.out_dir)
                    self._earlier = self._resumed(path, items[0]["step"] if items else 0)
                firings = (self._earlier + items)[:MAX_FIRINGS]
                more = self.more + len(self._earlier) + len(items) - len(firings)
                record = {"worker": self.hook.worker, "firings": firings, "more": more}
                self._store.write_bytes(path, json.dumps(record, indent=1).encode())
            except Exception as exc:
                logger.warning(
                    "smdebug: could not record a rule firing in the run: %s: %s", type(exc).__name__, exc
                )
                return
            with self._lock:
                self._written = version

    def _resumed(self, path: str, first_step: int) -> list[dict]:
        """The firings a resumed run (restarted after preemption) recorded before this hook: kept."""
        if not self._store.exists(path):
            return []
        try:
            found = decode_firings(self._store.read_bytes(path), path)
        except Exception as exc:
            logger.warning("smdebug: the earlier rule firings of this worker are replaced: %s", exc)
            return []
        return [
            {k: v for k, v in f.items() if k not in ("worker", "message")}
            for f in found
            if f["step"] < first_step
        ]

    def close(self) -> None:
        """The hook closes: a remote write still in flight gets the close timeout to finish."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            from smdebug.writing.settings import close_timeout_from_env

            thread.join(close_timeout_from_env())
        if self._fired != self._written and self.hook.writing and (thread is None or not thread.is_alive()):
            from smdebug.writing.bounded import run_bounded

            try:  # a firing the background write just missed
                run_bounded(self._write)
            except Exception as exc:
                logger.warning("smdebug: could not record a rule firing in the run: %s", exc)
