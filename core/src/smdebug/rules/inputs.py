"""Rules on the input data: image normalisation and token frequencies in sequences."""

from __future__ import annotations

import numpy as np

from smdebug.exceptions import SMDebugValueError
from smdebug.rules import params as p
from smdebug.rules.base import BuiltinRule, numeric


class CheckInputImages(BuiltinRule):
    """Once ``threshold_samples`` images were seen, fires when the mean of a colour channel is further
    than ``threshold_mean`` from zero (the input was not normalised)."""

    name = "check_input_images"

    def __init__(
        self,
        base_trial,
        threshold_mean=0.2,
        threshold_samples=500,
        regex=".*hybridsequential0_input_0",
        channel=1,
    ):
        super().__init__(base_trial)
        r = self.rule_name
        self.threshold_mean = p.to_float(r, "threshold_mean", threshold_mean, low=0)
        self.threshold_samples = p.to_int(r, "threshold_samples", threshold_samples, low=1)
        self.regex = p.to_regex_list(r, "regex", regex)
        if not self.regex:
            raise SMDebugValueError(f"{r}: parameter regex={regex!r} must name the input tensor")
        self.channel = p.to_int(r, "channel", channel, low=0)
        self._sum: np.ndarray | None = None  # per channel, over every image seen
        self._count = 0  # values per channel
        self._samples = 0

    def invoke_at_step(self, step):
        for tname in self._names(step, regexes=self.regex):
            value = numeric(self._value(tname, step))
            if value is None or value.ndim <= self.channel:
                continue
            per_channel = np.moveaxis(value.astype(np.float64), self.channel, 0).reshape(
                value.shape[self.channel], -1
            )
            if self._sum is None or self._sum.shape != (per_channel.shape[0],):
                self._sum, self._count, self._samples = np.zeros(per_channel.shape[0]), 0, 0
            self._sum += per_channel.sum(axis=1)
            self._count += per_channel.shape[1]
            self._samples += value.shape[0] if self.channel != 0 else 1
        if self._sum is None or self._samples < self.threshold_samples:
            return False
        means = self._sum / max(self._count, 1)
        worst = int(np.argmax(np.abs(means)))
        if abs(means[worst]) > self.threshold_mean:
            return self._hit(
                f"channel {worst} of the input images has mean {means[worst]:.3g} over {self._samples} images "
                f"(more than {self.threshold_mean:g} from 0: not normalised)"
            )
        return False


class NLPSequenceRatio(BuiltinRule):
    """Fires when a chosen token id makes up more than its percentage limit of an input sequence tensor."""

    name = "nlp_sequence_ratio"

    def __init__(
        self, base_trial, tensor_regex=".*embedding0_input_0", token_values="0", token_thresholds_percent="50"
    ):
        super().__init__(base_trial)
        r = self.rule_name
        self.tensor_regex = p.to_regex_list(r, "tensor_regex", tensor_regex) or [".*embedding0_input_0"]
        self.token_values = p.to_number_list(r, "token_values", token_values)
        self.token_thresholds_percent = p.to_number_list(
            r, "token_thresholds_percent", token_thresholds_percent
        )
        if not self.token_values:
            raise SMDebugValueError(f"{r}: parameter token_values={token_values!r} names no token")
        if len(self.token_values) != len(self.token_thresholds_percent):
            raise SMDebugValueError(
                f"{r}: token_values={token_values!r} and token_thresholds_percent={token_thresholds_percent!r} "
                f"must have one threshold per token"
            )
        for limit in self.token_thresholds_percent:
            if not 0 <= limit <= 100:
                raise SMDebugValueError(
                    f"{r}: parameter token_thresholds_percent={token_thresholds_percent!r} is out of range "
                    "(each must be between 0 and 100)"
                )

    def invoke_at_step(self, step):
        for tname in self._names(step, regexes=self.tensor_regex):
            value = numeric(self._value(tname, step))
            if value is None:
                continue
            for token, limit in zip(self.token_values, self.token_thresholds_percent):
                percent = 100.0 * np.count_nonzero(value == token) / value.size
                if percent > limit:
                    return self._hit(
                        f"{tname}: token {token:g} is {percent:.1f}% of the sequence (limit {limit:g}%)"
                    )
        return False
