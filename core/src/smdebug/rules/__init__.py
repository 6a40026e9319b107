"""Rules: conditions checked step by step on saved runs.

- ``Rule`` (subclass it, implement ``invoke_at_step``) and ``invoke_rule`` (run one over a trial);
- the built-in rules (``VanishingGradient``, ``LossNotDecreasing``, ...), ``builtin_rules()`` (by
  configuration name, plugins' rules included) and ``create_rule(name, base_trial, **params)``;
- ``rule_configs.<name>()``: each built-in rule's default configuration.
"""

from smdebug.rules import rule_configs
from smdebug.rules.builtin import builtin_rules, create_rule
from smdebug.rules.generic import (
    AllZero,
    CheckInputImages,
    ClassImbalance,
    Confusion,
    DeadRelu,
    ExplodingTensor,
    LossNotDecreasing,
    NLPSequenceRatio,
    Overfit,
    Overtraining,
    PoorWeightInitialization,
    SaturatedActivation,
    SimilarAcrossRuns,
    StalledTrainingRule,
    TensorVariance,
    UnchangedTensor,
    VanishingGradient,
    WeightUpdateRatio,
)
from smdebug.rules.rule import Rule

__all__ = [
    "Rule",
    "invoke_rule",
    "builtin_rules",
    "create_rule",
    "rule_configs",
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


def __getattr__(name):
    # Lazy, so that ``python -m smdebug.rules.rule_invoker`` does not find its module imported already.
    if name == "invoke_rule":
        from smdebug.rules.rule_invoker import invoke_rule

        return invoke_rule
    raise AttributeError(f"module 'smdebug.rules' has no attribute {name!r}")
