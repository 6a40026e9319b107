"""The in-training rule runner: a core plugin on the observation hooks.

``hook.add_rule(...)`` gives a hook a RuleRunner (none before: a hook without rules pays nothing for
them). At the end of each step it saved, the runner waits for the step to be written, reads it back
through a Trial of the run, and evaluates the rules; a rule whose action is ``stoptraining`` that fires
asks the hook's stop state (smdebug.stop_signal) to stop training. Every firing (whatever its action) is
also recorded in the run, in ``rules/<worker>.json`` (a folder smdebug 1.0's reader never lists), which
``Trial.rule_firings()``, ``smdebug ls`` and the report read. The runner uses only the hook's public
queries (``out_dir``, ``writing``, ``last_saved_step``, ``wait_for_writer``, ``written_steps``):
data flows from the hook to the rules, never back into the hook's writing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from smdebug.exceptions import (
    NoMoreData,
    RuleEvaluationConditionMet,
    SMDebugValueError,
    StepNotYetAvailable,
    StepUnavailable,
    StopTraining,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from smdebug.hookspecs import hookimpl
from smdebug.layout import MAX_NUMBER, load_json
from smdebug.rules.actions import STOP_TRAINING, parse_actions

if TYPE_CHECKING:
    from smdebug.hook import BaseHook
    from smdebug.stop_signal import StopSignal

logger = logging.getLogger("smdebug")

# How long a hook waits for its own step to be readable before skipping rule evaluation.
STEP_WAIT_SECONDS = 60.0
# How long the training thread waits for the writer to publish a step its rules judge.
RULE_FLUSH_SECONDS = 10.0

# The run's record of in-training firings: one file per worker, holding at most MAX_FIRINGS of them (the
# first ones; a rule that keeps firing would otherwise grow it every step) and how many more there were.
FIRINGS_DIR = "rules"
MAX_FIRINGS = 500
MAX_REASON = 1000

_runners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # hook -> its RuleRunner


@dataclass
class RuleResult:
    """A rule that fired: its name, the step, and why."""

    rule: str
    step: int
    reason: str = ""


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


def runner_of(hook: BaseHook, stop_signal: StopSignal | None = None) -> RuleRunner | None:
    """The hook's rule runner; made (with the hook's stop state) when ``stop_signal`` is given."""
    runner = _runners.get(hook)
    if runner is None and stop_signal is not None:
        runner = _runners[hook] = RuleRunner(hook, stop_signal)
    return runner


@hookimpl
def smdebug_step_end(hook, step):
    runner = _runners.get(hook)
    if runner is not None:
        runner.step_ended(step)


@hookimpl
def smdebug_hook_closed(hook):
    runner = _runners.get(hook)
    if runner is not None:  # no more steps to judge: the rules go (the results stay)
        runner.entries.clear()
        runner.firings.close()


class _LiveTrial:
    """The hook's own run, opened as a Trial the first time a rule reads it."""

    def __init__(self, path: str):
        self.path = path
        self._trial = None

    def __getattr__(self, name):
        if self._trial is None:
            from smdebug.trials import create_trial

            self._trial = create_trial(self.path)
        return getattr(self._trial, name)


@dataclass
class _Entry:
    rule: object
    actions: frozenset
    failed: bool = False


class RuleRunner:
    """Evaluates a hook's rules at the end of the steps it saved."""

    def __init__(self, hook: BaseHook, stop_signal: StopSignal):
        self.hook = hook
        self.stop_signal = stop_signal
        self.entries: list[_Entry] = []
        self.results: list[RuleResult] = []
        self.trial = _LiveTrial(hook.out_dir)
        self.firings = _FiringsRecord(hook)

    def add(self, rule, action=STOP_TRAINING, params=None):
        from smdebug.rules.builtin import create_rule
        from smdebug.rules.rule import Rule

        actions = parse_actions(action)
        params = dict(params or {})
        if isinstance(rule, Rule):
            if params:
                raise SMDebugValueError(
                    f"add_rule: parameters {sorted(params)} cannot be given with an already built rule"
                )
            obj = rule
        elif isinstance(rule, type) and issubclass(rule, Rule):
            obj = rule(self.trial, **params)
        else:
            obj = create_rule(rule, self.trial, **params)
        self.entries.append(_Entry(obj, actions))
        if self.hook.dry_run:
            logger.warning("smdebug: the hook is a dry run: nothing is saved, so its rules never run")
        return obj

    def step_ended(self, step: int) -> None:
        if self.entries and self._step_written(step):
            for entry in self.entries:
                if not entry.failed:
                    self._evaluate(entry, step)

    def _step_written(self, step: int) -> bool:
        hook = self.hook
        if not hook.writing or hook.last_saved_step != step:
            return False  # nothing was saved at this step: nothing new to judge
        # Rules read the step back: wait until the writer has published it (this makes the saving of
        # steps that rules judge synchronous, the price of judging them in-process), but not on a store
        # that fails or hangs: the step is then skipped.
        if not hook.wait_for_writer(RULE_FLUSH_SECONDS) or step not in hook.written_steps[-4:]:
            return False
        try:
            self.trial.wait_for_steps([step], timeout=STEP_WAIT_SECONDS)
        except Exception as exc:
            logger.warning("smdebug: rules skipped step %d: %s: %s", step, type(exc).__name__, exc)
            return False
        return True

    def _evaluate(self, entry: _Entry, step: int) -> None:
        rule = entry.rule
        name = getattr(rule, "rule_name", type(rule).__name__)
        try:
            rule.invoke(step)
        except RuleEvaluationConditionMet:
            reason = getattr(rule, "reason", "")
            self.results.append(RuleResult(name, step, reason))
            self.firings.add(name, step, reason, entry.actions)
            logger.warning("smdebug: rule %s fired at step %d%s", name, step, f": {reason}" if reason else "")
            if STOP_TRAINING in entry.actions:
                # written to the run too, so that every worker of a distributed run stops, not only this one
                self.stop_signal.request(StopTraining(name, step, reason), write_signal=self.hook.writing)
        except (
            TensorUnavailableForStep,
            TensorUnavailable,
            StepUnavailable,
            StepNotYetAvailable,
            NoMoreData,
        ):
            pass
        except Exception as exc:  # a broken rule never breaks training
            entry.failed = True
            logger.warning(
                "smdebug: rule %s failed at step %d and is no longer evaluated: %s: %s",
                name,
                step,
                type(exc).__name__,
                exc,
            )


class _FiringsRecord:
    """The firings of a hook's rules, written to the run at each firing (the whole file, atomically: a
    reader sees the old list or the new one). Only a firing costs anything. On a local disk the file is
    written at once; on a remote store on a thread of its own, so the training thread never waits on it."""

    def __init__(self, hook: BaseHook):
        self.hook = hook
        self.items: list[dict] = []
        self.more = 0  # firings beyond MAX_FIRINGS, counted only
        self._lock = threading.Lock()
        self._version = 0  # bumped at each firing
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
            self._version += 1
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
                version = self._version
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
        if self._version != self._written and self.hook.writing and (thread is None or not thread.is_alive()):
            from smdebug.writing.bounded import run_bounded

            try:  # a firing the background write just missed
                run_bounded(self._write)
            except Exception as exc:
                logger.warning("smdebug: could not record a rule firing in the run: %s", exc)
