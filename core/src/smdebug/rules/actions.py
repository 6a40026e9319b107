"""Actions taken when a rule fires: stopping training, in-process or through a stop signal.

- In-process: ``hook.add_rule(...)`` gives a hook rules that it evaluates at the end of every step it
  saved (``RuleRunner``). When a rule whose action is ``stoptraining`` fires, the hook asks training to
  stop: ``hook.should_stop()`` becomes True and the framework plugin stops training its own way (the
  PyTorch hook raises ``StopTraining`` from the next forward call).
- Sidecar: ``smdebug rules --watch OUT`` (or a rule configured with ``action_str="stoptraining"``) writes
  the stop signal, a small JSON file ``STOP_SIGNAL_FILE`` in the run's folder; a running hook looks for it
  at the end of each step and stops training the same way. The training thread never waits on a remote
  store for it: the signal of a remote run is read (and written) on a thread of its own.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass

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

logger = logging.getLogger("smdebug")

STOP_SIGNAL_FILE = "smdebug_stop_training.json"
STOP_TRAINING = "stoptraining"
# smdebug's other actions (Email, SMS) need AWS; they are accepted and ignored with a warning.
_IGNORED_ACTIONS = {"email", "sms"}
# How often a hook looks for the stop signal: on a local disk at the end of a step at most this often (a
# stat is a system call, which costs a fast training loop ~20 us a step), on a remote store in the background.
LOCAL_SIGNAL_CHECK_SECONDS = 0.05
REMOTE_SIGNAL_CHECK_SECONDS = 5.0
# How long a hook waits for its own step to be readable before skipping rule evaluation.
STEP_WAIT_SECONDS = 60.0
# How long the training thread waits for the writer to publish a step its rules judge.
RULE_FLUSH_SECONDS = 10.0


def parse_actions(action) -> frozenset[str]:
    """The actions of ``action``: None/"" (none), "stoptraining", a comma-separated list, a list, or
    smdebug's JSON form ``[{"name": "StopTraining", ...}]``."""
    if action is None:
        return frozenset()
    if isinstance(action, str):
        text = action.strip()
        if text.startswith(("[", "{")):
            try:
                action = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SMDebugValueError(f"action {action!r} is not valid JSON: {exc.msg}") from None
        else:
            action = [part for part in text.split(",") if part.strip()]
    if isinstance(action, dict):
        action = [action]
    names = set()
    for item in action:
        name = item.get("name", "") if isinstance(item, dict) else item
        key = str(name).strip().lower().replace("_", "").replace("-", "")
        if key in ("", "none", "log"):
            continue
        if key in _IGNORED_ACTIONS:
            logger.warning("smdebug: the %s action needs SageMaker; it is ignored here", name)
            continue
        if key != STOP_TRAINING:
            raise SMDebugValueError(
                f"action {name!r} is not supported (expected 'stoptraining', or None to only log)"
            )
        names.add(STOP_TRAINING)
    return frozenset(names)


# -- the stop signal ----------------------------------------------------------------------------------
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
        signal = json.loads(store.read_bytes(STOP_SIGNAL_FILE))
    except (OSError, ValueError):
        signal = None
    return signal if isinstance(signal, dict) else {"rule": "unknown", "step": -1, "reason": ""}


def clear_stop_signal(out_dir) -> None:
    store = _store(out_dir)
    if store.exists(STOP_SIGNAL_FILE):
        store.fs.rm(store.path(STOP_SIGNAL_FILE))


# -- rules evaluated by a hook ------------------------------------------------------------------------
@dataclass
class RuleResult:
    """A rule that fired: its name, the step, and why."""

    rule: str
    step: int
    reason: str = ""


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
    """Evaluates a hook's rules at the end of its steps and watches for the stop signal."""

    def __init__(self, hook):
        self.hook = hook
        self.entries: list[_Entry] = []
        self.results: list[RuleResult] = []
        self.stop: StopTraining | None = None
        self.stop_raised = False
        self.trial = _LiveTrial(hook.out_dir)
        self._last_signal_check = 0.0
        self._local = _is_local(hook.out_dir)
        self._signal_store = None
        self._signal_path: str | None = None  # the signal file's local path (local runs)
        self._checking: threading.Thread | None = None  # a remote check in flight
        self._cleared = hook.dry_run
        if self._local:
            self._clear_old_signal()

    def _clear_old_signal(self) -> None:
        """A signal left by an earlier, interrupted run in this folder is not for us."""
        self._cleared = True
        try:
            clear_stop_signal(self._signal_store or self.hook.out_dir)
        except Exception as exc:
            logger.debug("smdebug: could not look for an old stop signal: %s", exc)

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
        if time.monotonic() - self._last_signal_check >= LOCAL_SIGNAL_CHECK_SECONDS:  # the least a step does
            self.check_signal()

    def _step_written(self, step: int) -> bool:
        hook = self.hook
        writer = hook._writer
        if writer is None or not hook.writing or not hook._due:
            return False  # nothing was due at this step: nothing new to judge
        # Rules read the step back: wait until the writer has published it (this makes the saving of
        # steps that rules judge synchronous, the price of judging them in-process), but not on a store
        # that fails or hangs: the step is then skipped.
        if writer.failing or not writer.flush(RULE_FLUSH_SECONDS):
            return False
        if step not in writer.written_steps[-4:]:
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
            logger.warning("smdebug: rule %s fired at step %d%s", name, step, f": {reason}" if reason else "")
            if STOP_TRAINING in entry.actions:
                self.request_stop(StopTraining(name, step, reason))
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

    def request_stop(self, stop: StopTraining) -> None:
        if self.stop is not None:
            return
        self.stop = stop
        logger.warning("smdebug: %s", stop)
        if self.hook.writing:  # so that every worker of a distributed run stops, not only this one
            if self._local:
                self._write_signal(stop)
            else:
                _in_background(self._write_signal, stop)

    def _write_signal(self, stop: StopTraining) -> None:
        try:
            write_stop_signal(self.hook.out_dir, stop.rule_name, stop.step, stop.reason)
        except Exception as exc:
            logger.warning("smdebug: could not write the stop signal: %s", exc)

    def check_signal(self) -> None:
        """Look for the stop signal: on a local disk at a step end at most every 50 ms; on a remote store
        every few seconds, on a thread of its own (what it found is seen at the next step end)."""
        if self.stop is not None or self.hook.dry_run:
            return
        now = time.monotonic()
        if self._local:
            if now - self._last_signal_check >= LOCAL_SIGNAL_CHECK_SECONDS:
                self._last_signal_check = now
                self._look_for_signal()
            return
        if self._checking is not None and self._checking.is_alive():
            return  # the last check still waits on the store
        if now - self._last_signal_check < REMOTE_SIGNAL_CHECK_SECONDS:
            return
        self._last_signal_check = now
        self._checking = _in_background(self._look_for_signal)

    def _look_for_signal(self) -> None:
        try:
            if self._signal_store is None:  # the run's store, opened once for the checks
                self._signal_store = self.hook._store or _store(self.hook.out_dir)
            if not self._cleared:
                self._clear_old_signal()
                return
            if self._signal_path is None and self._signal_store.is_local:
                self._signal_path = self._signal_store.path(STOP_SIGNAL_FILE)
            if self._signal_path is not None and not os.path.exists(self._signal_path):
                return  # every step on a local disk: one stat, no Store call
            signal = read_stop_signal(self._signal_store)
        except Exception as exc:
            logger.debug("smdebug: could not look for the stop signal: %s", exc)
            return
        if signal is not None and self.stop is None:
            reason = signal.get("reason") or "stop signal"
            stop = StopTraining(str(signal.get("rule", "unknown")), int(signal.get("step", -1)), reason)
            stop.source = "signal"
            self.stop = stop
            logger.warning("smdebug: stop signal found in %s: %s", self.hook.out_dir, stop)

    def pending_stop(self) -> StopTraining | None:
        """The StopTraining to raise, once."""
        if self.stop is None or self.stop_raised:
            return None
        self.stop_raised = True
        return self.stop
