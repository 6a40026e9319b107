"""Default configurations of the built-in rules, in the form SageMaker and ``smdebug-rulesconfig`` use::

    {"DebugRuleConfiguration": {"RuleConfigurationName": "VanishingGradient",
                                "RuleParameters": {"rule_to_invoke": "VanishingGradient"}},
     "CollectionConfigurations": [{"CollectionName": "gradients",
                                   "CollectionParameters": {"save_interval": "500"}}]}

``CollectionConfigurations`` (present only when the rule needs a collection saved) lists what the hook
must save for the rule. ``create_rule(config, trial, **params)`` builds the rule from such a dict.
"""

from __future__ import annotations

SAVE_INTERVAL = "500"


def _config(rule: str, collections: dict[str, str | None] | None = None) -> dict:
    config: dict = {
        "DebugRuleConfiguration": {
            "RuleConfigurationName": rule,
            "RuleParameters": {"rule_to_invoke": rule},
        }
    }
    if collections:
        config["CollectionConfigurations"] = [
            {
                "CollectionName": name,
                "CollectionParameters": {
                    **({"include_regex": regex} if regex else {}),
                    "save_interval": SAVE_INTERVAL,
                },
            }
            for name, regex in collections.items()
        ]
    return config


def vanishing_gradient() -> dict:
    return _config("VanishingGradient", {"gradients": None})


def exploding_tensor() -> dict:
    return _config("ExplodingTensor")


def similar_across_runs() -> dict:
    return _config("SimilarAcrossRuns")


def weight_update_ratio() -> dict:
    return _config("WeightUpdateRatio", {"weights": None})


def all_zero() -> dict:
    return _config("AllZero")


def unchanged_tensor() -> dict:
    return _config("UnchangedTensor")


def loss_not_decreasing() -> dict:
    return _config("LossNotDecreasing", {"losses": None})


def check_input_images() -> dict:
    return _config("CheckInputImages", {"input_image": ".*hybridsequential0_input_0"})


def dead_relu() -> dict:
    return _config("DeadRelu", {"relu_output": ".*relu_output"})


def confusion() -> dict:
    return _config("Confusion")


def class_imbalance() -> dict:
    return _config("ClassImbalance")


def overfit() -> dict:
    return _config("Overfit")


def overtraining() -> dict:
    return _config("Overtraining")


def tensor_variance() -> dict:
    return _config("TensorVariance")


def poor_weight_initialization() -> dict:
    return _config("PoorWeightInitialization", {"relu_input": ".*relu_input"})


def saturated_activation() -> dict:
    return _config("SaturatedActivation")


def nlp_sequence_ratio() -> dict:
    return _config("NLPSequenceRatio", {"input_sequence": ".*embedding0_input_0"})


def stalled_training_rule() -> dict:
    return _config("StalledTrainingRule")


# XGBoost's rules live in the XGBoost plugin; their configurations are plain data and live here.
def tree_depth() -> dict:
    return _config("TreeDepth")


def feature_importance_overweight() -> dict:
    return _config("FeatureImportanceOverweight", {"feature_importance": None})


ALL = (
    "vanishing_gradient",
    "exploding_tensor",
    "similar_across_runs",
    "weight_update_ratio",
    "all_zero",
    "unchanged_tensor",
    "loss_not_decreasing",
    "check_input_images",
    "dead_relu",
    "confusion",
    "class_imbalance",
    "overfit",
    "overtraining",
    "tensor_variance",
    "poor_weight_initialization",
    "saturated_activation",
    "nlp_sequence_ratio",
    "stalled_training_rule",
    "tree_depth",
    "feature_importance_overweight",
)


def get(name: str) -> dict:
    """The default configuration of a rule by its configuration name."""
    if name not in ALL:
        from smdebug.exceptions import SMDebugValueError

        raise SMDebugValueError(f"no default configuration for rule {name!r} (known: {', '.join(ALL)})")
    return globals()[name]()
