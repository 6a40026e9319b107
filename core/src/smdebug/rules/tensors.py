"""Rules on the values of saved tensors: vanishing, exploding, all-zero, unchanged, variance, similarity
across runs, weight update ratio."""

from __future__ import annotations

import numpy as np

from smdebug.exceptions import SMDebugError, SMDebugValueError, TensorUnavailableForStep
from smdebug.modes import ModeKeys
from smdebug.rules import params as p
from smdebug.rules.base import BuiltinRule, numeric


def _collection_or_regex(rule: BuiltinRule, step: int, collection: str, fallback: str) -> list[str]:
    """Names in a built-in collection; by its usual pattern when the run saved no such collection."""
    if collection in rule.base_trial.collections():
        return rule._names(step, collections=[collection])
    return rule._names(step, regexes=[fallback])


def _require_selection(rule: str, collection_names, tensor_regex) -> None:
    if not collection_names and not tensor_regex:
        raise SMDebugValueError(
            f"{rule}: give collection_names or tensor_regex (at least one is required), e.g. "
            f'collection_names="weights" or tensor_regex=".*relu_output"'
        )


class VanishingGradient(BuiltinRule):
    """Fires when a gradient's mean absolute value falls below ``threshold``."""

    name = "vanishing_gradient"

    def __init__(self, base_trial, threshold=0.0000001):
        super().__init__(base_trial)
        self.threshold = p.to_float(self.rule_name, "threshold", threshold, low=0)

    def invoke_at_step(self, step):
        for tname in _collection_or_regex(self, step, "gradients", "^gradient"):
            try:
                abs_mean = self.base_trial.tensor(tname).reduction_value(step, "mean", abs=True)
            except (TensorUnavailableForStep, TypeError, ValueError):
                continue
            self._judged = True
            if abs_mean < self.threshold:
                return self._hit(f"{tname}: mean |gradient| {abs_mean:.3g} < threshold {self.threshold:g}")
        return False


# Collections whose NaNs are there by design, left out unless chosen: XGBoost's tree tables (a leaf
# row has no split feature, threshold nor children).
NAN_BY_DESIGN = ("trees",)


class ExplodingTensor(BuiltinRule):
    """Fires when a tensor holds NaN (or, unless ``only_nan``, infinite) values."""

    name = "exploding_tensor"

    def __init__(self, base_trial, collection_names=None, tensor_regex=None, only_nan=False):
        super().__init__(base_trial)
        self.collection_names = p.to_list(self.rule_name, "collection_names", collection_names)
        self.tensor_regex = p.to_regex_list(self.rule_name, "tensor_regex", tensor_regex)
        self.only_nan = p.to_bool(self.rule_name, "only_nan", only_nan)

    def _bad(self, values) -> bool:
        values = numeric(np.asarray(values))
        if values is None or values.dtype.kind in "iub":
            return False
        return bool(np.isnan(values).any() if self.only_nan else (~np.isfinite(values)).any())

    def invoke_at_step(self, step):
        what = "NaN" if self.only_nan else "NaN or infinite"
        names = self._names(step, self.collection_names, self.tensor_regex, all_if_empty=True)
        if not (self.collection_names or self.tensor_regex):  # every tensor, but tables NaN by design
            trial = self.base_trial
            by_design = [c for c in NAN_BY_DESIGN if c in trial.collections()]
            skip = set(trial.tensor_names(step=step, collection=by_design)) if by_design else set()
            names = [n for n in names if n not in skip]
        for tname in names:
            value = self._value(tname, step)
            if value is None:  # saved as reductions only: a non-finite tensor has non-finite reductions
                try:
                    stored = list(self.base_trial.tensor(tname).reduction_values(step).values())
                except SMDebugError:
                    continue
                if not stored:
                    continue
                self._judged = True
                value = np.array([float(np.asarray(v).reshape(-1)[0]) for v in stored])
            if self._bad(value):
                return self._hit(f"{tname} holds {what} values")
        return False


class AllZero(BuiltinRule):
    """Fires when at least ``threshold`` percent of a tensor's elements are zero."""

    name = "all_zero"

    def __init__(self, base_trial, collection_names=None, tensor_regex=None, threshold=100):
        super().__init__(base_trial)
        self.collection_names = p.to_list(self.rule_name, "collection_names", collection_names)
        self.tensor_regex = p.to_regex_list(self.rule_name, "tensor_regex", tensor_regex)
        _require_selection(self.rule_name, self.collection_names, self.tensor_regex)
        self.threshold = p.to_float(self.rule_name, "threshold", threshold, low=0, high=100)

    def invoke_at_step(self, step):
        for tname in self._names(step, self.collection_names, self.tensor_regex):
            value = self._value(tname, step)
            if value is None:
                percent = self._percent_from_reductions(tname, step)
                if percent is None:
                    continue
                self._judged = True
            elif value.size == 0:
                continue
            else:
                percent = 100.0 * np.count_nonzero(value == 0) / value.size
            if percent >= self.threshold:
                return self._hit(f"{tname}: {percent:.1f}% of its elements are zero")
        return False

    def _percent_from_reductions(self, tname: str, step: int) -> float | None:
        """A tensor saved as reductions only: 100 when its saved max |x| (or max and min) is 0, None when
        they cannot tell (another share of zeros needs the values)."""
        saved = self.base_trial.tensor(tname).reduction_values(step)
        extremes = [saved.get(k) for k in (("max", True), ("max", False), ("min", False))]
        if extremes[0] is not None:
            return 100.0 if float(extremes[0]) == 0 else None
        if extremes[1] is not None and extremes[2] is not None:
            return 100.0 if float(extremes[1]) == 0 == float(extremes[2]) else None
        return None


class UnchangedTensor(BuiltinRule):
    """Fires when a tensor's values at its last ``num_steps`` saved steps are all close."""

    name = "unchanged_tensor"

    def __init__(
        self,
        base_trial,
        collection_names=None,
        tensor_regex=None,
        num_steps=3,
        rtol=1e-05,
        atol=1e-08,
        equal_nan=False,
    ):
        super().__init__(base_trial)
        self.collection_names = p.to_list(self.rule_name, "collection_names", collection_names)
        self.tensor_regex = p.to_regex_list(self.rule_name, "tensor_regex", tensor_regex)
        _require_selection(self.rule_name, self.collection_names, self.tensor_regex)
        self.num_steps = p.to_int(self.rule_name, "num_steps", num_steps, low=2)
        self.rtol = p.to_float(self.rule_name, "rtol", rtol, low=0)
        self.atol = p.to_float(self.rule_name, "atol", atol, low=0)
        self.equal_nan = p.to_bool(self.rule_name, "equal_nan", equal_nan)

    def invoke_at_step(self, step):
        mode, mode_step = self.base_trial.mode_modestep(step)
        for tname in self._names(step, self.collection_names, self.tensor_regex):
            tensor = self.base_trial.tensor(tname)
            # A tensor saved in TRAIN mode is compared between TRAIN steps only, as weight_update_ratio
            # does: weights saved while evaluating do not change, by design.
            use, current = (ModeKeys.TRAIN, mode_step) if tensor.steps(mode=ModeKeys.TRAIN) else (None, step)
            if use is not None and mode != use:
                continue
            saved = tensor.steps(mode=use) if use is not None else tensor.steps()
            steps = [s for s in saved if s <= current][-self.num_steps :]
            if len(steps) < self.num_steps or steps[-1] != current:
                continue  # no verdict before num_steps saved steps
            values = [self._value(tname, s, use or ModeKeys.GLOBAL) for s in steps]
            if any(v is None or numeric(v) is None for v in values):
                continue
            last = values[-1]
            if all(
                v.shape == last.shape
                and np.allclose(v, last, rtol=self.rtol, atol=self.atol, equal_nan=self.equal_nan)
                for v in values[:-1]
            ):
                which = "TRAIN steps" if current != step else "steps"  # mode steps, when they differ
                return self._hit(f"{tname} did not change over {which} {', '.join(map(str, steps))}")
        return False


class TensorVariance(BuiltinRule):
    """Fires when a tensor's variance is above ``max_threshold`` or below ``min_threshold``."""

    name = "tensor_variance"

    def __init__(
        self, base_trial, collection_names=None, tensor_regex=None, max_threshold=None, min_threshold=None
    ):
        super().__init__(base_trial)
        self.collection_names = p.to_list(self.rule_name, "collection_names", collection_names)
        self.tensor_regex = p.to_regex_list(self.rule_name, "tensor_regex", tensor_regex)
        _require_selection(self.rule_name, self.collection_names, self.tensor_regex)
        self.max_threshold = p.to_float(self.rule_name, "max_threshold", max_threshold, optional=True)
        self.min_threshold = p.to_float(self.rule_name, "min_threshold", min_threshold, optional=True)
        if self.max_threshold is None and self.min_threshold is None:
            self.logger.warning("smdebug: %s has neither max_threshold nor min_threshold", self.rule_name)

    def invoke_at_step(self, step):
        for tname in self._names(step, self.collection_names, self.tensor_regex):
            value = numeric(self._value(tname, step))
            var = float(np.var(value)) if value is not None else self._saved_variance(tname, step)
            if var is None:
                continue
            self._judged = True
            if self.max_threshold is not None and var > self.max_threshold:
                return self._hit(f"{tname}: variance {var:.3g} > max_threshold {self.max_threshold:g}")
            if self.min_threshold is not None and var < self.min_threshold:
                return self._hit(f"{tname}: variance {var:.3g} < min_threshold {self.min_threshold:g}")
        return False

    def _saved_variance(self, tname: str, step: int) -> float | None:
        """A tensor saved as reductions only: its saved variance (or std squared), None without one."""
        tensor = self.base_trial.tensor(tname)
        for reduction, power in (("variance", 1), ("std", 2)):
            try:
                return float(tensor.reduction_value(step, reduction)) ** power
            except (SMDebugError, TypeError, ValueError):
                continue
        return None


class SimilarAcrossRuns(BuiltinRule):
    """Fires when a tensor saved in both runs at a step has different values in the two."""

    name = "similar_across_runs"

    def __init__(
        self, base_trial, other_trial=None, collection_names=None, tensor_regex=None, other_trials=None
    ):
        if other_trial is None and other_trials:
            other_trial = list(other_trials)[0]
        if other_trial is None or (isinstance(other_trial, str) and not other_trial.strip()):
            raise SMDebugValueError(
                "SimilarAcrossRuns: parameter other_trial is required (the path of the run to compare with)"
            )
        if isinstance(other_trial, str):
            from smdebug.layout import no_run_here
            from smdebug.trials import create_trial

            path, other_trial = other_trial.strip(), create_trial(other_trial.strip(), missing_ok=True)
            if not other_trial.steps(show_incomplete_steps=True) and not other_trial.collections():
                raise SMDebugValueError(
                    f"{self.name}: parameter other_trial: {no_run_here(other_trial.store, path)}"
                )
        super().__init__(base_trial, other_trials=[other_trial])
        self.other_trial = other_trial
        self.collection_names = p.to_list(self.rule_name, "collection_names", collection_names)
        self.tensor_regex = p.to_regex_list(self.rule_name, "tensor_regex", tensor_regex)

    def invoke_at_step(self, step):
        for tname in self._names(step, self.collection_names, self.tensor_regex, all_if_empty=True):
            if not self.other_trial.has_tensor(tname):
                continue
            mine = self._read(tname, step)
            try:
                if mine is not None:
                    theirs = np.asarray(self.other_trial.tensor(tname).value(step))
                    differs = mine.shape != theirs.shape or not np.allclose(mine, theirs, equal_nan=True)
                else:  # saved as reductions only: the reductions both runs saved are compared
                    differs = self._reductions_differ(tname, step)
            except SMDebugError:
                continue  # not saved at this step in the other run
            if differs is None:
                continue  # no reduction saved by both
            self._judged = True
            if differs:
                return self._hit(f"{tname} differs from {self.other_trial.name} at step {step}")
        return False

    def _reductions_differ(self, tname: str, step: int) -> bool | None:
        """Whether a reduction both runs saved differs; None when they saved none in common."""
        mine = self.base_trial.tensor(tname).reduction_values(step)
        theirs = self.other_trial.tensor(tname).reduction_values(step)
        both = sorted(set(mine) & set(theirs))
        if not both:
            return None
        return any(not np.allclose(mine[k], theirs[k], equal_nan=True) for k in both)


class WeightUpdateRatio(BuiltinRule):
    """Fires when ``|w_s - w_p| / (|w_p| + epsilon)`` is above ``large_threshold`` or below
    ``small_threshold`` for a weight saved at steps s and p."""

    name = "weight_update_ratio"

    def __init__(
        self,
        base_trial,
        num_steps=None,
        large_threshold=10.0,
        small_threshold=0.00000001,
        epsilon=0.000000001,
    ):
        super().__init__(base_trial)
        self.num_steps = p.to_int(self.rule_name, "num_steps", num_steps, low=1, optional=True)
        self.large_threshold = p.to_float(self.rule_name, "large_threshold", large_threshold, low=0)
        self.small_threshold = p.to_float(self.rule_name, "small_threshold", small_threshold, low=0)
        self.epsilon = p.to_float(self.rule_name, "epsilon", epsilon, low=0)

    def invoke_at_step(self, step):
        mode, mode_step = self.base_trial.mode_modestep(step)
        # the weights collection only, as smdebug 1.0: a name pattern would take other tensors for weights
        # (XGBoost's feature_importance/weight/*, a gradient/fc.weight), whose values often repeat
        for tname in self._names(
            step, collections=["weights"] if "weights" in self.base_trial.collections() else []
        ):
            tensor = self.base_trial.tensor(tname)
            # Weights saved in TRAIN mode are compared between TRAIN steps only.
            use = ModeKeys.TRAIN if tensor.steps(mode=ModeKeys.TRAIN) else ModeKeys.GLOBAL
            if use == ModeKeys.TRAIN and mode != ModeKeys.TRAIN:
                continue
            current = mode_step if use == ModeKeys.TRAIN else step
            earlier = [
                s
                for s in tensor.steps(mode=use)
                if s < current and (self.num_steps is None or s >= current - self.num_steps)
            ]
            if not earlier:
                continue
            now, before = self._value(tname, current, use), self._value(tname, earlier[-1], use)
            if numeric(now) is None or numeric(before) is None or now.shape != before.shape:
                continue
            ratio = float(np.linalg.norm(now - before) / (np.linalg.norm(before) + self.epsilon))
            if ratio > self.large_threshold:
                return self._hit(
                    f"{tname}: update ratio {ratio:.3g} > large_threshold {self.large_threshold:g}"
                )
            if ratio < self.small_threshold:
                return self._hit(
                    f"{tname}: update ratio {ratio:.3g} < small_threshold {self.small_threshold:g}"
                )
        return False
