"""XGBoost's built-in rules, contributed through the ``smdebug_rules`` hook.

Parameters may arrive as strings (the SageMaker way); a bad value fails at construction with an error
naming the rule, the parameter and the value. Neither rule needs xgboost: they read saved runs.
"""

from __future__ import annotations

import math
import re

import numpy as np

from smdebug.exceptions import SMDebugValueError
from smdebug.rules.rule import Rule
from smdebug_xgb.trees import tree_depths


def _number(rule: str, name: str, value, kind=float, low=None, high=None):
    try:
        if isinstance(value, bool):
            raise ValueError
        text = value.strip() if isinstance(value, str) else value
        number = kind(float(text)) if kind is int and isinstance(text, float) else kind(text)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise SMDebugValueError(f"{rule}: parameter {name}={value!r} is not {what}") from None
    if isinstance(number, float) and math.isnan(number):
        raise SMDebugValueError(f"{rule}: parameter {name}={value!r} is not a number")
    if (low is not None and number < low) or (high is not None and number > high):
        limits = f"between {low} and {high}" if high is not None else f">= {low}"
        raise SMDebugValueError(f"{rule}: parameter {name}={value!r} is out of range (must be {limits})")
    return number


class TreeDepth(Rule):
    """Fires at a step when a tree saved at that step (``trees/...``) is deeper than ``depth``.

    The depth is the tree's real depth, followed from its ``trees/ID``, ``trees/Yes`` and ``trees/No``
    columns; when only ``trees/Node`` was saved it is ``log2`` of the largest node id, as SageMaker
    documents it.
    """

    name = "tree_depth"

    def __init__(self, base_trial, depth=4):
        super().__init__(base_trial)
        self.depth = _number(self.rule_name, "depth", depth, low=0)
        self.reason = ""

    def invoke_at_step(self, step: int) -> bool:
        trial = self.base_trial
        nodes = trial.tensor("trees/Node").value(step)  # TensorUnavailableForStep: skipped by invoke_rule
        if nodes.size == 0:
            return False
        columns = ("trees/ID", "trees/Yes", "trees/No", "trees/Tree")
        saved = set(trial.tensor_names(step=step))
        if saved.issuperset(columns):
            ids, yes, no, trees = (trial.tensor(name).value(step) for name in columns)
            depths = tree_depths(ids, yes, no, trees)
            tree, depth = max(depths.items(), key=lambda item: item[1])
            where = f"tree {tree} is {depth} deep"
        else:
            largest = int(np.max(nodes))
            depth = math.log2(largest) if largest > 0 else 0.0
            where = f"log2 of the largest node id {largest} is {depth:.2f}"
        if depth > self.depth:
            self.reason = f"{where}, more than depth={self.depth:g}"
            return True
        return False


class FeatureImportanceOverweight(Rule):
    """Fires at a step when the ``nfeatures`` most important features hold more than ``threshold`` of the
    total importance (of the tensors matching ``tensor_regex``, the "weight" type by default). Not at the
    first round: its few trees, on few features, hold all the importance by construction."""

    name = "feature_importance_overweight"

    def __init__(
        self,
        base_trial,
        threshold=0.8,
        nfeatures=3,
        tensor_regex=".*feature_importance/weight",
    ):
        super().__init__(base_trial)
        self.threshold = _number(self.rule_name, "threshold", threshold, low=0.0, high=1.0)
        self.nfeatures = _number(self.rule_name, "nfeatures", nfeatures, kind=int, low=1)
        patterns = self.parse_list(tensor_regex)
        if not patterns:
            raise SMDebugValueError(f"{self.rule_name}: parameter tensor_regex={tensor_regex!r} is empty")
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SMDebugValueError(
                    f"{self.rule_name}: parameter tensor_regex={tensor_regex!r} is not a valid regular "
                    f"expression: {exc}"
                ) from None
        self.tensor_regex = patterns
        self.reason = ""

    def invoke_at_step(self, step: int) -> bool:
        trial = self.base_trial
        if trial.mode_modestep(step)[1] == 0:  # one round's trees: a few features hold it all by construction
            return False
        scores = {}
        for name in trial.tensor_names(step=step, regex=self.tensor_regex):
            value = np.asarray(trial.tensor(name).value(step), dtype=np.float64).reshape(-1)
            if value.size == 1:
                scores[name] = float(value[0])
        total = sum(scores.values())
        if not scores or total <= 0:
            return False
        top = sorted(scores.items(), key=lambda item: item[1], reverse=True)[: self.nfeatures]
        share = sum(v for _, v in top) / total
        if share > self.threshold:
            names = ", ".join(name.rsplit("/", 1)[-1] for name, _ in top)
            self.reason = (
                f"the top {len(top)} features ({names}) hold {share:.1%} of the importance, "
                f"more than threshold={self.threshold:g}"
            )
            return True
        return False


RULES = {rule.name: rule for rule in (TreeDepth, FeatureImportanceOverweight)}
