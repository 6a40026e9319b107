"""Rules on classifier labels and predictions: confusion matrix and class imbalance."""

from __future__ import annotations

from collections import Counter

import numpy as np

from smdebug.rules import params as p
from smdebug.rules.base import BuiltinRule


def _class_ids(value: np.ndarray | None, argmax: bool, predictions: bool = False) -> np.ndarray | None:
    """Class ids, or None for values that are none: a regression's targets and predictions, a ranker's
    scores (whole numbers are ids; a binary classifier's probabilities in [0, 1] round at 0.5)."""
    if value is None or value.size == 0 or value.dtype.kind not in "iufb":
        return None
    # one probability per sample (a sigmoid output of shape (batch, 1)) is rounded, not argmax-ed: over a
    # last axis of one, argmax would predict class 0 for every sample
    if argmax and value.ndim > 1 and value.shape[-1] > 1:
        value = np.argmax(value, axis=-1)
    value = value.reshape(-1)
    if value.dtype.kind == "f" and not np.array_equal(value, np.rint(value)):
        if not (predictions and value.min() >= 0 and value.max() <= 1):
            return None
    return np.rint(value).astype(np.int64)


def _or(value, default):
    return default if value is None else value


class Confusion(BuiltinRule):
    """Fires when, in a column of the confusion matrix, the diagonal share is below ``min_diag`` or an
    off-diagonal share above ``max_off_diag``."""

    name = "confusion"

    def __init__(
        self,
        base_trial,
        category_no=None,
        labels="labels",
        predictions="predictions",
        labels_collection="labels",
        predictions_collection="predictions",
        min_diag=0.9,
        max_off_diag=0.1,
    ):
        super().__init__(base_trial)
        r = self.rule_name
        self.category_no = p.to_int(r, "category_no", category_no, low=2, optional=True)
        self.labels = str(labels or "labels").strip()
        self.predictions = str(predictions or "predictions").strip()
        self.labels_collection = str(labels_collection or "labels").strip()
        self.predictions_collection = str(predictions_collection or "predictions").strip()
        # as the docs say, a parameter left out (None) takes its default
        self.min_diag = _or(p.to_float(r, "min_diag", min_diag, low=0, high=1, optional=True), 0.9)
        self.max_off_diag = _or(
            p.to_float(r, "max_off_diag", max_off_diag, low=0, high=1, optional=True), 0.1
        )

    def _find(self, step, name, collection) -> np.ndarray | None:
        names = self.base_trial.tensor_names(step=step)
        if name not in names:
            in_collection = self._names(step, collections=[collection])
            if not in_collection:
                return None
            name = in_collection[0]
        return self._value(name, step)

    def invoke_at_step(self, step):
        labels = _class_ids(self._find(step, self.labels, self.labels_collection), False)
        predictions = _class_ids(
            self._find(step, self.predictions, self.predictions_collection), True, predictions=True
        )
        if labels is None or predictions is None or labels.size != predictions.size:
            return False
        n = self.category_no or int(max(labels.max(), predictions.max())) + 1
        keep = (labels >= 0) & (labels < n) & (predictions >= 0) & (predictions < n)
        matrix = np.zeros((n, n), dtype=np.int64)
        np.add.at(matrix, (labels[keep], predictions[keep]), 1)
        for i in range(n):
            column = matrix[:, i].sum()
            if column == 0:
                continue
            if matrix[i, i] / column < self.min_diag:
                return self._hit(
                    f"class {i}: only {matrix[i, i] / column:.0%} of its predictions are right (min_diag {self.min_diag:g})"
                )
            for j in range(n):
                if j != i and matrix[j, i] / column > self.max_off_diag:
                    return self._hit(
                        f"{matrix[j, i] / column:.0%} of the predictions of class {i} are class {j} "
                        f"(max_off_diag {self.max_off_diag:g})"
                    )
        return False


class ClassImbalance(BuiltinRule):
    """Once ``samples`` labels were seen, fires when the largest class is more than ``threshold_imbalance``
    times the smallest, or a class is mispredicted more than ``threshold_misprediction`` of the time."""

    name = "class_imbalance"

    def __init__(
        self,
        base_trial,
        threshold_imbalance=10,
        threshold_misprediction=0.7,
        samples=500,
        argmax=False,
        labels_regex=".*labels",
        predictions_regex=".*predictions",
    ):
        super().__init__(base_trial)
        r = self.rule_name
        self.threshold_imbalance = p.to_float(r, "threshold_imbalance", threshold_imbalance, low=1)
        self.threshold_misprediction = p.to_float(
            r, "threshold_misprediction", threshold_misprediction, low=0, high=1
        )
        self.samples = p.to_int(r, "samples", samples, low=1)
        self.argmax = p.to_bool(r, "argmax", argmax)
        self.labels_regex = p.to_regex_list(r, "labels_regex", labels_regex) or [".*labels"]
        self.predictions_regex = p.to_regex_list(r, "predictions_regex", predictions_regex) or [
            ".*predictions"
        ]
        self._counts: Counter = Counter()
        self._wrong: Counter = Counter()

    def invoke_at_step(self, step):
        label_names = self._names(step, regexes=self.labels_regex)
        prediction_names = self._names(step, regexes=self.predictions_regex)
        if label_names:
            labels = _class_ids(self._value(label_names[0], step), False)
            predictions = None
            if prediction_names:
                predictions = _class_ids(
                    self._value(prediction_names[0], step), self.argmax, predictions=True
                )
            if labels is not None:
                self._counts.update(labels.tolist())
                if predictions is not None and predictions.size == labels.size:
                    self._wrong.update(labels[labels != predictions].tolist())
        total = sum(self._counts.values())
        if total < self.samples or not self._counts:
            return False
        (big, most), (small, least) = self._counts.most_common()[0], self._counts.most_common()[-1]
        if most / least > self.threshold_imbalance:
            return self._hit(
                f"class {big} has {most} samples and class {small} only {least} "
                f"(ratio {most / least:.1f} > {self.threshold_imbalance:g})"
            )
        for cls, count in sorted(self._counts.items()):
            share = self._wrong[cls] / count
            if share > self.threshold_misprediction:
                return self._hit(f"class {cls} is mispredicted {share:.0%} of the time")
        return False
