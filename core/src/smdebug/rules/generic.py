"""The built-in rule classes under the module path older smdebug releases used (``smdebug.rules.generic``)."""

from smdebug.rules.activations import DeadRelu, PoorWeightInitialization, SaturatedActivation
from smdebug.rules.classification import ClassImbalance, Confusion
from smdebug.rules.inputs import CheckInputImages, NLPSequenceRatio
from smdebug.rules.losses import LossNotDecreasing, Overfit, Overtraining
from smdebug.rules.stalled import StalledTrainingRule
from smdebug.rules.tensors import (
    AllZero,
    ExplodingTensor,
    SimilarAcrossRuns,
    TensorVariance,
    UnchangedTensor,
    VanishingGradient,
    WeightUpdateRatio,
)

__all__ = [
    "AllZero",
    "CheckInputImages",
    "ClassImbalance",
    "Confusion",
    "DeadRelu",
    "ExplodingTensor",
    "LossNotDecreasing",
    "NLPSequenceRatio",
    "Overfit",
    "Overtraining",
    "PoorWeightInitialization",
    "SaturatedActivation",
    "SimilarAcrossRuns",
    "StalledTrainingRule",
    "TensorVariance",
    "UnchangedTensor",
    "VanishingGradient",
    "WeightUpdateRatio",
]
