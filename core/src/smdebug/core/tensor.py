"""``smdebug.core.tensor``: the same StepState (what ``Trial.has_passed_step`` returns) and Tensor as
``smdebug.trials``."""

from smdebug.trials.tensor import StepState, Tensor

__all__ = ["StepState", "Tensor"]
