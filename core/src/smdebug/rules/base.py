"""BuiltinRule: what the built-in rules share (tensor selection, reading values, saying why they fired)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from smdebug.exceptions import TensorUnavailable, TensorUnavailableForStep
from smdebug.modes import ModeKeys
from smdebug.rules.rule import Rule


class BuiltinRule(Rule):
    """A built-in rule. ``name`` is its configuration name (``vanishing_gradient``), ``reason`` says
    why it fired last (shown by ``smdebug rules``)."""

    name: ClassVar[str] = ""

    def __init__(self, base_trial, other_trials=None, action_str: str = ""):
        super().__init__(base_trial, action_str=action_str, other_trials=other_trials)
        self.reason = ""

    def _hit(self, reason: str) -> bool:
        self.reason = reason
        return True

    # -- choosing tensors -----------------------------------------------------------------------------
    def _names(self, step: int, collections=(), regexes=(), all_if_empty: bool = False, trial=None) -> list:
        """Names saved at ``step``: those in ``collections`` plus those matching ``regexes`` (every name
        when both are empty and ``all_if_empty``)."""
        trial = trial or self.base_trial
        if not collections and not regexes:
            return trial.tensor_names(step=step) if all_if_empty else []
        found: set[str] = set()
        if collections:
            found.update(trial.tensor_names(step=step, collection=list(collections)))
        if regexes:
            found.update(trial.tensor_names(step=step, regex=list(regexes)))
        return sorted(found)

    def _value(self, name: str, step: int, mode=ModeKeys.GLOBAL, trial=None) -> np.ndarray | None:
        """The saved value, or None when only reductions (or nothing) were saved for it at this step."""
        trial = trial or self.base_trial
        try:
            return np.asarray(trial.tensor(name).value(step, mode=mode))
        except (TensorUnavailableForStep, TensorUnavailable):
            return None

    def _scalar(self, name: str, step: int, mode=ModeKeys.GLOBAL) -> float | None:
        """The value of a scalar tensor (a loss), None when it is not a single number."""
        value = self._value(name, step, mode)
        if value is None or value.size != 1 or value.dtype.kind not in "iuf":
            return None
        return float(value.reshape(-1)[0])


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
