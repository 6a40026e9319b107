"""BuiltinRule: what the built-in rules share (tensor selection, reading values, saying why they fired)."""

from __future__ import annotations

import inspect
from typing import ClassVar

import numpy as np

from smdebug.exceptions import SMDebugValueError, TensorUnavailable, TensorUnavailableForStep, did_you_mean
from smdebug.modes import ModeKeys
from smdebug.rules.rule import Rule


class BuiltinRule(Rule):
    """A built-in rule. ``name`` is its configuration name (``vanishing_gradient``), ``reason`` says
    why it fired last (shown by ``smdebug rules``)."""

    name: ClassVar[str] = ""
    reads_tensors: ClassVar[bool] = True  # False: the rule judges something else (time, for a stall)

    def __init__(self, base_trial, other_trials=None, action_str: str = ""):
        super().__init__(base_trial, action_str=action_str, other_trials=other_trials)
        self.reason = ""
        self._looked = self._matched = False  # whether _names was asked, and found anything
        self._judged = False  # whether a value (or a saved reduction) was judged: else "no data"

    def _hit(self, reason: str) -> bool:
        self.reason = reason
        return True

    # -- choosing tensors -----------------------------------------------------------------------------
    def _names(self, step: int, collections=(), regexes=(), all_if_empty: bool = False, trial=None) -> list:
        """Names saved at ``step``: those in ``collections`` plus those matching ``regexes`` (every name
        when both are empty and ``all_if_empty``)."""
        trial = trial or self.base_trial
        self._looked = True
        if not collections and not regexes:
            found = trial.tensor_names(step=step) if all_if_empty else []
            self._matched = self._matched or bool(found)
            return found
        found: set[str] = set()
        if collections:
            self._check_collections(collections, trial)
            found.update(trial.tensor_names(step=step, collection=list(collections)))
        if regexes:
            found.update(trial.tensor_names(step=step, regex=list(regexes)))
        self._matched = self._matched or bool(found)
        return sorted(found)

    def _check_collections(self, collections, trial) -> None:
        """A collection the user named that the run does not have is a typo: an error that says so."""
        asked = getattr(self, "collection_names", None) or ()
        known = trial.collections()
        for name in collections:
            if known and name in asked and name not in known:
                raise SMDebugValueError(
                    f"{self.rule_name}: parameter collection_names: the run has no collection {name!r}"
                    f"{did_you_mean(name, known)} (it has {', '.join(sorted(known))})"
                )

    def unmatched(self) -> str:
        """Why the rule judged nothing although the user chose its tensors (collection_names,
        tensor_regex, regex): that choice matched no saved tensor; "" otherwise."""
        if not self._looked or self._matched:
            return ""
        defaults = inspect.signature(type(self).__init__).parameters
        given = []
        for param in ("collection_names", "tensor_regex", "regex"):
            value = getattr(self, param, None)
            if param in defaults and value and value != _as_list(defaults[param].default):
                given.append(f"{param}={','.join(value)!r}")
        if not given:
            return ""
        names = sorted(self.base_trial.tensor_names(), key=len)[:3]
        saved = f" (the run saves e.g. {', '.join(names)})" if names else ""
        return f"{self.rule_name} checked nothing: {' and '.join(given)} matched no saved tensor{saved}"

    def nothing_checked(self) -> str:
        why = super().nothing_checked()
        if why or not self.reads_tensors or self._judged:
            return why
        if self._matched:  # saved, but not as it judges them (other reductions), or too few steps
            return (
                "nothing to check: the tensors it selected hold nothing it can judge at the evaluated steps"
            )
        return "nothing to check: the run saved no tensor this rule reads at the evaluated steps"

    def _value(self, name: str, step: int, mode=ModeKeys.GLOBAL, trial=None) -> np.ndarray | None:
        """The saved value, or None when only reductions (or nothing) were saved for it at this step."""
        value = self._read(name, step, mode, trial)
        self._judged = self._judged or value is not None  # a value read: the rule had something to judge
        return value

    def _read(self, name: str, step: int, mode=ModeKeys.GLOBAL, trial=None) -> np.ndarray | None:
        trial = trial or self.base_trial
        try:
            return np.asarray(trial.tensor(name).value(step, mode=mode))
        except (TensorUnavailableForStep, TensorUnavailable):
            return None

    def _scalar(self, name: str, step: int, mode=ModeKeys.GLOBAL) -> float | None:
        """The value of a scalar tensor (a loss), None when it is not a single number (not judged)."""
        value = self._read(name, step, mode)
        if value is None or value.size != 1 or value.dtype.kind not in "iuf":
            return None
        self._judged = True
        return float(value.reshape(-1)[0])


def _as_list(value) -> list[str]:
    if value is None or value is inspect.Parameter.empty:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(item).strip() for item in items if str(item).strip()]


def numeric(array: np.ndarray) -> np.ndarray | None:
    """The array as floats, None for non-numeric or empty arrays."""
    if array is None or array.size == 0:
        return None
    if array.dtype.kind == "b":
        return array.astype(np.float64)
    if array.dtype.kind not in "iufc":
        return None
    return array


def per_unit(array: np.ndarray) -> np.ndarray:
    """The array as (units, observations): a unit is a feature or channel (axis 1, as NCHW and (N, F)
    layouts put it), observed over the batch and any spatial positions."""
    if array.ndim <= 1:
        return array.reshape(-1, 1)
    return np.moveaxis(array, 1, 0).reshape(array.shape[1], -1)
