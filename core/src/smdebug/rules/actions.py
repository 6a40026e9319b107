"""Actions taken when a rule fires: stopping training, in-process or through a stop signal.

- In-process: ``hook.add_rule(...)`` gives a hook rules that it evaluates at the end of every step it
  saved (``smdebug.rules.runner``). When a rule whose action is ``stoptraining`` fires, the hook asks training to
  stop: ``hook.should_stop()`` becomes True and the framework plugin stops training its own way (the
  PyTorch hook raises ``StopTraining`` from the next forward call).
- Sidecar: ``smdebug rules --watch OUT`` (or a rule configured with ``action_str="stoptraining"``) writes
  the stop signal, a small JSON file ``STOP_SIGNAL_FILE`` in the run's folder; a running hook looks for it
  at the end of each step and stops training the same way (``smdebug.stop_signal``, whose functions are
  importable from here too).
"""

from __future__ import annotations

import json
import logging

from smdebug.exceptions import SMDebugValueError
from smdebug.stop_signal import (  # noqa: F401 (the stop signal's functions, importable from here)
    LOCAL_SIGNAL_CHECK_SECONDS,
    REMOTE_SIGNAL_CHECK_SECONDS,
    STOP_SIGNAL_FILE,
    clear_stop_signal,
    read_stop_signal,
    write_stop_signal,
)

logger = logging.getLogger("smdebug")

STOP_TRAINING = "stoptraining"
# smdebug's other actions (Email, SMS) need AWS; they are accepted and ignored with a warning.
_IGNORED_ACTIONS = {"email", "sms"}


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
