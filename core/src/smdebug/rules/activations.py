"""Rules on activations: dead ReLUs, saturated tanh/sigmoid, poor weight initialization.

A "unit" (node) is one feature or channel, axis 1 of the tensor, observed over the batch and any spatial
positions.
"""

from __future__ import annotations

import numpy as np

from smdebug.rules import params as p
from smdebug.rules.base import BuiltinRule, numeric, per_unit
from smdebug.rules.losses import _LossRule


class DeadRelu(BuiltinRule):
    """Fires when more than ``threshold_layer`` percent of a layer's ReLU units are active (> 0) less
    than ``threshold_inactivity`` percent of the time."""

    name = "dead_relu"

    def __init__(
        self, base_trial, tensor_regex=".*relu_output", threshold_inactivity=1.0, threshold_layer=50.0
    ):
        super().__init__(base_trial)
        r = self.rule_name
        self.tensor_regex = p.to_regex_list(r, "tensor_regex", tensor_regex) or [".*relu_output"]
        self.threshold_inactivity = p.to_float(
            r, "threshold_inactivity", threshold_inactivity, low=0, high=100
        )
        self.threshold_layer = p.to_float(r, "threshold_layer", threshold_layer, low=0, high=100)

    def invoke_at_step(self, step):
        for tname in self._names(step, regexes=self.tensor_regex):
            value = numeric(self._value(tname, step))
            if value is None:
                continue
            active = 100.0 * (per_unit(value) > 0).mean(axis=1)
            dead = 100.0 * np.count_nonzero(active < self.threshold_inactivity) / active.size
            if dead > self.threshold_layer:
                return self._hit(f"{tname}: {dead:.0f}% of its units are dead")
        return False


class SaturatedActivation(BuiltinRule):
    """Fires when more than ``threshold_layer`` percent of a tanh/sigmoid layer's nodes get fewer than
    ``threshold_inactivity`` percent of their inputs inside the non-flat range."""

    name = "saturated_activation"

    def __init__(
        self,
        base_trial,
        collection_names=None,
        tensor_regex=".*tanh_input|.*sigmoid_input",
        threshold_tanh_min=-9.4999,
        threshold_tanh_max=9.4999,
        threshold_sigmoid_min=-23,
        threshold_sigmoid_max=16.99999,
        threshold_inactivity=1.0,
        threshold_layer=50.0,
        threshold_tanh=None,
        threshold_sigmoid=None,
    ):
        super().__init__(base_trial)
        r = self.rule_name
        self.collection_names = p.to_list(r, "collection_names", collection_names)
        self.tensor_regex = p.to_regex_list(r, "tensor_regex", tensor_regex)
        # earlier docs gave each range as one pair, threshold_tanh=(-9.4999, 9.4999): it wins when given
        self.tanh = p.to_range_or_none(r, "threshold_tanh", threshold_tanh) or (
            p.to_float(r, "threshold_tanh_min", threshold_tanh_min),
            p.to_float(r, "threshold_tanh_max", threshold_tanh_max),
        )
        self.sigmoid = p.to_range_or_none(r, "threshold_sigmoid", threshold_sigmoid) or (
            p.to_float(r, "threshold_sigmoid_min", threshold_sigmoid_min),
            p.to_float(r, "threshold_sigmoid_max", threshold_sigmoid_max),
        )
        self.threshold_inactivity = p.to_float(
            r, "threshold_inactivity", threshold_inactivity, low=0, high=100
        )
        self.threshold_layer = p.to_float(r, "threshold_layer", threshold_layer, low=0, high=100)

    def invoke_at_step(self, step):
        for tname in self._names(step, self.collection_names, self.tensor_regex):
            lowered = tname.lower()
            limits = self.tanh if "tanh" in lowered else self.sigmoid if "sigmoid" in lowered else None
            value = numeric(self._value(tname, step))
            if limits is None or value is None:
                continue
            units = per_unit(value)
            inside = 100.0 * ((units > limits[0]) & (units < limits[1])).mean(axis=1)
            saturated = 100.0 * np.count_nonzero(inside < self.threshold_inactivity) / inside.size
            if saturated > self.threshold_layer:
                return self._hit(f"{tname}: {saturated:.0f}% of its nodes are saturated")
        return False


class PoorWeightInitialization(_LossRule):
    """During the first ``steps`` steps, fires when the per-layer variances of activation inputs differ
    by more than ``threshold`` times, when a gradient's 5th-95th percentile range is below
    ``distribution_range``, or when the loss has not decreased for ``patience`` steps."""

    name = "poor_weight_initialization"

    def __init__(
        self,
        base_trial,
        activation_inputs_regex=".*relu_input",
        threshold=10.0,
        distribution_range=0.001,
        patience=5,
        steps=10,
    ):
        super().__init__(base_trial)
        r = self.rule_name
        self.activation_inputs_regex = p.to_regex_list(r, "activation_inputs_regex", activation_inputs_regex)
        self.threshold = p.to_float(r, "threshold", threshold, low=1)
        self.distribution_range = p.to_float(r, "distribution_range", distribution_range, low=0)
        self.patience = p.to_int(r, "patience", patience, low=1)
        self.steps = p.to_int(r, "steps", steps, low=1)
        self._best_loss: float | None = None
        self._since_best = 0

    def invoke_at_step(self, step):
        if step >= self.steps:
            return False
        return self._variances(step) or self._gradients(step) or self._loss(step)

    def _variances(self, step) -> bool:
        variances = {}
        for tname in self._names(step, regexes=self.activation_inputs_regex):
            value = numeric(self._value(tname, step))
            if value is not None:
                variances[tname] = float(np.var(value))
        if len(variances) < 2:
            return False
        low, high = min(variances.values()), max(variances.values())
        if high > self.threshold * low:
            return self._hit(
                f"activation input variances range from {low:.3g} to {high:.3g} across layers "
                f"(more than {self.threshold:g} times)"
            )
        return False

    def _gradients(self, step) -> bool:
        collections = ["gradients"] if "gradients" in self.base_trial.collections() else []
        regexes = [] if collections else ["^gradient"]
        for tname in self._names(step, collections, regexes):
            value = numeric(self._value(tname, step))
            if value is None or value.size < 2:  # a single number has no spread to judge
                continue
            p5, p95 = np.percentile(value, [5, 95])
            if p95 - p5 < self.distribution_range:
                return self._hit(f"{tname}: gradients spread over only {p95 - p5:.3g} (5th-95th percentile)")
        return False

    def _loss(self, step) -> bool:
        losses = self._losses(step)
        if not losses:
            return False
        loss = min(losses.values())
        if self._best_loss is None or loss < self._best_loss:
            self._best_loss, self._since_best = loss, 0
            return False
        self._since_best += 1
        if self._since_best >= self.patience:
            return self._hit(f"loss has not decreased for {self._since_best} steps")
        return False
