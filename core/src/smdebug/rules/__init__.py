"""Rules: conditions checked step by step on saved runs.

- ``Rule`` (subclass it, implement ``invoke_at_step``), ``invoke_rule`` (run one over a trial, as smdebug 1.0)
  and ``evaluate_rule`` (the same, returning the steps at which it fired);
- the built-in rules (``VanishingGradient``, ``LossNotDecreasing``, ...), ``builtin_rules()`` (by
  configuration name, plugins' rules included) and ``create_rule(name, base_trial, **params)``;
- ``rule_configs.<name>()``: each built-in rule's default configuration.

Names are imported on first use, so that a hook (which needs only ``smdebug.rules.actions``) stays cheap
to create and ``python -m smdebug.rules.rule_invoker`` does not find its module imported already.
"""

from importlib import import_module

_GENERIC = (
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
)
_LAZY = {
    "Rule": "smdebug.rules.rule",
    "invoke_rule": "smdebug.rules.rule_invoker",
    "evaluate_rule": "smdebug.rules.rule_invoker",
    "RequiredTensors": "smdebug.rules.req_tensors",  # exported here by smdebug 1.0 too
    "RequiredTensorsForTrial": "smdebug.rules.req_tensors",
    "builtin_rules": "smdebug.rules.builtin",
    "create_rule": "smdebug.rules.builtin",
    "evaluate_runs": "smdebug.rules.sweep",
    **{name: "smdebug.rules.generic" for name in _GENERIC},
}

__all__ = ["rule_configs", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if name == "rule_configs":
        return import_module("smdebug.rules.rule_configs")
    raise AttributeError(f"module 'smdebug.rules' has no attribute {name!r}")
