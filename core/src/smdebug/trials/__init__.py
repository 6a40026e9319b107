"""Reading saved runs: ``create_trial(path)`` gives a Trial; ``trial.tensor(name)`` a Tensor."""

from smdebug.trials.dataframe import to_dataframe
from smdebug.trials.divergence import diff
from smdebug.trials.tensor import Tensor
from smdebug.trials.trial import LocalTrial, S3Trial, StepState, Trial, create_trial

__all__ = ["Trial", "LocalTrial", "S3Trial", "Tensor", "StepState", "create_trial", "to_dataframe", "diff"]
