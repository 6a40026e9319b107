"""Rules on scalar losses: loss not decreasing, overfitting, overtraining.

These rules keep state between steps, so they expect the steps of a run in increasing order (as
``invoke_rule``, the hook and ``smdebug rules`` give them).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from smdebug.exceptions import SMDebugValueError
from smdebug.modes import ModeKeys
from smdebug.rules import params as p
from smdebug.rules.base import BuiltinRule

LOSSES = "losses"
LOSS_FALLBACK_REGEX = "[Ll]oss"  # when a run saved no losses collection


class _LossRule(BuiltinRule):
    collection_names: list[str] = []
    tensor_regex: list[str] = []
    use_losses_collection = True

    def _loss_names(self, step: int) -> list[str]:
        collections = list(self.collection_names)
        regexes = list(self.tensor_regex)
        if self.use_losses_collection:
            if LOSSES in self.base_trial.collections():
                collections.append(LOSSES)
            elif not collections and not regexes:
                regexes.append(LOSS_FALLBACK_REGEX)
        return self._names(step, collections, regexes)

    def _losses(self, step: int, mode=ModeKeys.GLOBAL, mode_step=None, finite=True) -> dict[str, float]:
        """Scalar losses saved at a (global) step, by name; non-scalar matches are ignored, and so are
        NaN and infinite losses unless ``finite`` is False."""
        out = {}
        for name in self._loss_names(step):
            value = self._scalar(name, step if mode_step is None else mode_step, mode)
            if value is not None and (np.isfinite(value) or not finite):
                out[name] = value
        return out


class LossNotDecreasing(_LossRule):
    """Fires when a loss did not drop by ``diff_percent`` percent over ``num_steps`` steps."""

    name = "loss_not_decreasing"

    def __init__(
        self,
        base_trial,
        collection_names=None,
        tensor_regex=None,
        use_losses_collection=True,
        num_steps=10,
        diff_percent=0.1,
        increase_threshold_percent=5,
        mode="GLOBAL",
    ):
        super().__init__(base_trial)
        r = self.rule_name
        self.collection_names = p.to_list(r, "collection_names", collection_names)
        self.tensor_regex = p.to_regex_list(r, "tensor_regex", tensor_regex)
        self.use_losses_collection = p.to_bool(r, "use_losses_collection", use_losses_collection)
        if not (self.use_losses_collection or self.collection_names or self.tensor_regex):
            raise SMDebugValueError(
                f"{r}: with use_losses_collection=False give collection_names or tensor_regex for the losses"
            )
        self.num_steps = p.to_int(r, "num_steps", num_steps, low=1)
        self.diff_percent = p.to_float(r, "diff_percent", diff_percent, low=0, high=100)
        self.increase_threshold_percent = p.to_float(
            r, "increase_threshold_percent", increase_threshold_percent, low=0, high=100
        )
        # None: the first of EVAL, TRAIN, GLOBAL that has losses (smdebug's earlier behaviour).
        self.mode = p.to_mode_or_none(r, "mode", mode)
        self._last_check: int | None = None

    def _mode(self) -> ModeKeys:
        if self.mode is not None:
            return self.mode
        for mode in (ModeKeys.EVAL, ModeKeys.TRAIN):
            if self.base_trial.steps(mode=mode):
                return mode
        return ModeKeys.GLOBAL

    def invoke_at_step(self, step):
        mode = self._mode()
        trial = self.base_trial
        if mode == ModeKeys.GLOBAL:
            current = step
            # a loss is compared with itself on the same data: a TRAIN step's with a TRAIN step's, never
            # with a validation loss saved in between
            same_mode = trial.mode_modestep(step)[0]
        else:
            step_mode, current = self.base_trial.mode_modestep(step)
            if step_mode != mode:
                return False
        if self._last_check is not None and current < self._last_check + self.num_steps:
            return False
        checked, fired = False, False
        # a loss that became NaN or infinite did not decrease: it is judged too
        for name, loss in self._losses(step, mode, current, finite=False).items():
            earlier = [
                s
                for s in trial.tensor(name).steps(mode=mode)
                if s <= current - self.num_steps
                and (mode != ModeKeys.GLOBAL or trial.mode_modestep(s)[0] == same_mode)
            ]
            if not earlier:
                continue
            before = self._scalar(name, earlier[-1], mode)
            if before is None or not np.isfinite(before):
                continue
            checked = True
            if not np.isfinite(loss) and not fired:
                fired = self._hit(
                    f"{name}: {loss} at step {current} (it was {before:.4g} at step {earlier[-1]})"
                )
            elif loss >= before * (1 - self.diff_percent / 100) and not fired:
                fired = self._hit(
                    f"{name}: {loss:.4g} at step {current} vs {before:.4g} at step {earlier[-1]} "
                    f"(needed a drop of {self.diff_percent:g}%)"
                )
            elif loss > before * (1 + self.increase_threshold_percent / 100) and not fired:
                fired = self._hit(f"{name}: rose from {before:.4g} to {loss:.4g}")
        if checked:
            self._last_check = current
        return fired


class Overfit(_LossRule):
    """Fires when ``(mean validation loss - mean training loss) / mean training loss`` exceeds
    ``ratio_threshold`` for ``patience`` evaluation steps in a row."""

    name = "overfit"

    def __init__(self, base_trial, tensor_regex=None, start_step=0, patience=1, ratio_threshold=0.1):
        super().__init__(base_trial)
        r = self.rule_name
        self.tensor_regex = p.to_regex_list(r, "tensor_regex", tensor_regex)
        self.use_losses_collection = not self.tensor_regex
        self.start_step = p.to_int(r, "start_step", start_step, low=0)
        self.patience = p.to_int(r, "patience", patience, low=1)
        self.ratio_threshold = p.to_float(r, "ratio_threshold", ratio_threshold)
        # Per loss: the training losses of the last training phase, the validation losses of the
        # current evaluation phase, and how many evaluation steps in a row were over the threshold.
        self._train: dict[str, list[float]] = defaultdict(list)
        self._val: dict[str, list[float]] = defaultdict(list)
        self._train_mean: dict[str, float] = {}
        self._over: dict[str, int] = defaultdict(int)
        self._phase = None

    def invoke_at_step(self, step):
        if step < self.start_step:
            return False
        mode, mode_step = self.base_trial.mode_modestep(step)
        if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL):
            return False
        losses = self._losses(step, mode, mode_step)
        if mode != self._phase:  # a new phase begins
            if mode == ModeKeys.EVAL:
                self._train_mean.update({n: float(np.mean(v)) for n, v in self._train.items() if v})
                self._val.clear()
            else:
                self._train.clear()
            self._phase = mode
        fired = False
        for name, loss in losses.items():
            if mode == ModeKeys.TRAIN:
                self._train[name].append(loss)
                continue
            self._val[name].append(loss)
            train_mean = self._train_mean.get(name)
            if not train_mean:
                continue
            ratio = (float(np.mean(self._val[name])) - train_mean) / abs(train_mean)
            self._over[name] = self._over[name] + 1 if ratio > self.ratio_threshold else 0
            if self._over[name] >= self.patience and not fired:
                fired = self._hit(
                    f"{name}: validation loss is {ratio:.1%} above the training loss "
                    f"(ratio_threshold {self.ratio_threshold:g})"
                )
        return fired


class Overtraining(_LossRule):
    """Fires when the training (validation) loss has not improved on its best by ``delta`` for
    ``patience_train`` (``patience_validation``) saved steps."""

    name = "overtraining"

    def __init__(self, base_trial, patience_train=5, patience_validation=10, delta=0.01):
        super().__init__(base_trial)
        r = self.rule_name
        self.patience_train = p.to_int(r, "patience_train", patience_train, low=1)
        self.patience_validation = p.to_int(r, "patience_validation", patience_validation, low=1)
        self.delta = p.to_float(r, "delta", delta, low=0)
        self._best: dict[tuple[str, ModeKeys], float] = {}
        self._since: dict[tuple[str, ModeKeys], int] = defaultdict(int)

    def invoke_at_step(self, step):
        mode, mode_step = self.base_trial.mode_modestep(step)
        if mode == ModeKeys.PREDICT:
            return False
        validation = mode == ModeKeys.EVAL
        patience = self.patience_validation if validation else self.patience_train
        fired = False
        for name, loss in self._losses(step, mode, mode_step).items():
            key = (name, mode)
            best = self._best.get(key)
            if best is None or loss < best - self.delta:
                self._best[key], self._since[key] = loss, 0
                continue
            self._since[key] += 1
            if self._since[key] >= patience and not fired:
                # a GLOBAL step's loss may be either (XGBoost's validation-logloss): no claim which
                which = {ModeKeys.EVAL: "validation ", ModeKeys.TRAIN: "training "}.get(mode, "")
                fired = self._hit(
                    f"{name}: {which}loss has not improved on {best:.4g} by {self.delta:g} "
                    f"for {self._since[key]} steps"
                )
        return fired
