"""The XGBoost hook: a training callback for which one step is one boosting round.

    hook = smd.Hook(out_dir, include_collections=["metrics", "feature_importance"], train_data=dtrain)
    xgboost.train(params, dtrain, evals=[(dval, "validation")], callbacks=[hook])

Tensor names are smdebug 1.0's: ``<eval name>-<metric>`` (``validation-logloss``),
``hyperparameters/<param>``, ``predictions`` and ``labels`` (on validation_data),
``feature_importance/<importance type>/<feature>`` (normalised to sum to 1 per type),
``full_shap/<feature>`` (the n_samples x (n_features + 1) contributions on train_data),
``average_shap/<feature>`` and ``trees/<trees_to_dataframe column>`` (the trees of the round).

Under ``xgboost.dask`` each worker gets a copy of the hook (Dask pickles callbacks); the copy names its
worker from XGBoost's collective rank and flushes when its training ends.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import xgboost as xgb

from smdebug import plugins
from smdebug.collection import CollectionKeys
from smdebug.config import SaveConfig
from smdebug.exceptions import ConfigError
from smdebug.hook import BaseHook
from smdebug.writer import END_OF_JOB_FILE
from smdebug_xgb.collection import (
    AVERAGE_SHAP_PREFIX,
    BIAS,
    BUILTIN_PATTERNS,
    FEATURE_IMPORTANCE_PREFIX,
    FULL_SHAP_PREFIX,
    HYPERPARAMETERS_PREFIX,
    IMPORTANCE_TYPES,
    LABELS,
    PREDICTIONS,
    TREE_COLUMNS,
    TREES_PREFIX,
    XGBOOST_COLLECTIONS,
)
from smdebug_xgb.data import load_data
from smdebug_xgb.trees import tree_columns

logger = logging.getLogger("smdebug")

# smdebug 1.0's XGBoost hook saves every 10 rounds when given no save configuration.
DEFAULT_SAVE_INTERVAL = 10
TREE_BOOSTERS = ("gbtree", "dart")


class Hook(BaseHook, xgb.callback.TrainingCallback):
    framework = "xgboost"
    default_include_collections = (CollectionKeys.METRICS,)
    builtin_collections = XGBOOST_COLLECTIONS

    def __init__(
        self,
        out_dir: str | None = None,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config=None,
        save_config=None,
        include_regex=None,
        include_collections=None,
        save_all: bool = False,
        include_workers: str = "one",
        hyperparameters: Mapping[str, Any] | None = None,
        train_data=None,
        validation_data=None,
        *,
        max_queue_bytes: int | None = None,
    ):
        if hyperparameters is not None and not isinstance(hyperparameters, Mapping):
            raise ConfigError(f"hyperparameters: expected a dict, got {type(hyperparameters).__name__}")
        train = load_data("train_data", train_data)
        validation = load_data("validation_data", validation_data)
        self._is_copy = getattr(self, "_is_copy", False)  # set by _restore for a Dask worker's copy
        super().__init__(
            out_dir=out_dir,
            export_tensorboard=export_tensorboard,
            tensorboard_dir=tensorboard_dir,
            dry_run=dry_run,
            reduction_config=reduction_config,
            save_config=SaveConfig(save_interval=DEFAULT_SAVE_INTERVAL)
            if save_config is None
            else save_config,
            include_regex=include_regex,
            include_collections=include_collections,
            save_all=save_all,
            include_workers=include_workers,
            max_queue_bytes=max_queue_bytes,
        )
        for name, pattern in BUILTIN_PATTERNS.items():
            self.get_collection(name).include(pattern)
        self.hyperparameters = dict(hyperparameters) if hyperparameters else None
        self.train_data = train
        self.validation_data = validation
        self._data_arguments = {"train_data": train_data, "validation_data": validation_data}
        self._rounds_done = 0  # rounds seen by this hook, so a second training continues the steps
        self._round_offset = 0
        self._shipped = False  # pickled for Dask workers
        self._warned: set[str] = set()
        self._training: _Training | None = None

    @classmethod
    def hook_from_config(cls, json_config_path: str | None = None):
        """smdebug 1.0's older name of ``create_from_json_file``."""
        return cls.create_from_json_file(json_config_path)

    # -- distributed training: XGBoost's collective (Dask, Spark, ...) ------------------------------
    def _get_worker_name(self) -> str:
        return f"worker_{xgb.collective.get_rank()}"

    def _get_num_workers(self) -> int:
        return xgb.collective.get_world_size()

    def _check_out_dir(self) -> None:
        if not self._is_copy:  # a worker's copy writes beside the others in the run its original checked
            super()._check_out_dir()

    # -- xgboost.callback.TrainingCallback --------------------------------------------------------------
    def before_training(self, model):
        # Rounds are steps 0, 1, ...; after steps this hook already used (an earlier training, or
        # save_scalar before training) the numbering goes on, so no saved step is written over.
        self._round_offset = max(self._rounds_done, self.step + 1)
        self._training = _Training(_params_of_train_call())
        return model

    def after_iteration(self, model, epoch: int, evals_log) -> bool:
        if self._closed:
            return False
        try:
            self._save_round(model, epoch, evals_log)
        except Exception as exc:  # never break training
            self._warn_once(
                "round", "smdebug: could not save boosting round %d: %s: %s", epoch, type(exc).__name__, exc
            )
        # True stops boosting: a rule added with hook.add_rule fired, or the run's stop signal was left.
        if self.should_stop():
            logger.warning("smdebug: boosting stopped after round %d: %s", epoch, self.stop_reason)
            return True
        return False

    def after_training(self, model):
        try:
            if self._is_copy:
                self._finish_copy()
            else:
                self._flush()
        except Exception as exc:
            self._warn_once(
                "flush", "smdebug: could not flush %s: %s: %s", self.out_dir, type(exc).__name__, exc
            )
        self._training = None
        return model

    # -- one boosting round -------------------------------------------------------------------------
    def _save_round(self, model, epoch: int, evals_log) -> None:
        if self._training is None:  # called without before_training (a hand-written training loop)
            self.before_training(model)
        step = self._round_offset + epoch
        self._rounds_done = max(self._rounds_done, step + 1)
        self.step = step - 1  # begin_step moves both counters to this round
        self.mode_steps[self.mode] = step - 1
        self.begin_step()
        try:
            if not (self._in_step and self._writing and self._due):
                return
            self._guard("metrics", self._save_metrics, evals_log)
            self._guard("hyperparameters", self._save_hyperparameters, model)
            if not isinstance(model, xgb.Booster):  # xgboost.cv hands callbacks a pack of boosters
                self._warn_once("cv", "smdebug: with xgboost.cv only metrics and hyperparameters are saved")
                return
            self._guard("predictions", self._save_predictions, model)
            self._guard("feature importance", self._save_feature_importance, model)
            self._guard("trees", self._save_trees, model)
            self._guard("SHAP values", self._save_shap, model)
        finally:
            self.end_step()

    def _save_metrics(self, evals_log) -> None:
        metrics = self.collection_manager.get(CollectionKeys.METRICS, cls=self.collection_class)
        for data_name, results in evals_log.items():
            for metric, history in results.items():
                if not history:
                    continue
                value = history[-1]
                if isinstance(value, tuple):  # xgboost.cv: (mean, std) over the folds
                    value = value[0]
                name = f"{data_name}-{metric}"
                if not metrics.matches(name):  # an eval name with "/" in it is a metric all the same
                    metrics.add_tensor_name(name)
                    self._colls_of.pop(name, None)
                self._save(name, np.array([float(value)]))

    def _save_hyperparameters(self, model) -> None:
        if not self._any_due_prefix(HYPERPARAMETERS_PREFIX):
            return
        params = self.hyperparameters or self._training.params
        if params is None:
            params = self._training.config_params(model) if isinstance(model, xgb.Booster) else {}
        for key, value in params.items():
            self._save(HYPERPARAMETERS_PREFIX + str(key), _param_array(value))

    def _save_predictions(self, model) -> None:
        due = [name for name in (PREDICTIONS, LABELS) if self.is_due(name)]
        if not due:
            return
        if self.validation_data is None:
            self._warn_once(
                "validation", "smdebug: to save predictions and labels, give the hook validation_data="
            )
            return
        if PREDICTIONS in due:
            self._save(PREDICTIONS, model.predict(self.validation_data))
        if LABELS in due:
            self._save(LABELS, self.validation_data.get_label())

    def _save_feature_importance(self, model) -> None:
        features = _feature_names(model)
        for kind in IMPORTANCE_TYPES:
            prefix = f"{FEATURE_IMPORTANCE_PREFIX}{kind}/"
            if not any(self.is_due(prefix + f) for f in features):
                continue
            if not self._is_tree_booster(model, "feature importance"):
                return
            scores = model.get_score(importance_type=kind)
            total = float(sum(scores.values()))
            if total <= 0:  # no split yet
                continue
            for feature, score in scores.items():
                self._save(prefix + feature, np.array([score / total]))

    def _save_trees(self, model) -> None:
        due = [c for c in TREE_COLUMNS if self.is_due(TREES_PREFIX + c)]
        if not due or not self._is_tree_booster(model, "trees"):
            return
        rounds = model.num_boosted_rounds()
        dumps = model.get_dump(with_stats=True, dump_format="json")
        per_round = len(dumps) // rounds if rounds else 0
        first = (rounds - 1) * per_round  # the trees this round added
        columns = tree_columns(dumps[first : first + per_round], first)
        for column in due:
            self._save(TREES_PREFIX + column, columns[column])

    def _save_shap(self, model) -> None:
        features = [*_feature_names(model), BIAS]
        full = [i for i, f in enumerate(features) if self.is_due(FULL_SHAP_PREFIX + f)]
        average = [i for i, f in enumerate(features) if self.is_due(AVERAGE_SHAP_PREFIX + f)]
        if not (full or average):
            return
        if self.train_data is None:
            self._warn_once("train_data", "smdebug: to save SHAP values, give the hook train_data=")
            return
        contributions = model.predict(self.train_data, pred_contribs=True)
        for i in full:  # as smdebug 1.0: each feature's tensor holds the whole matrix
            self._save(FULL_SHAP_PREFIX + features[i], contributions)
        if average:
            # The reference's definition: the sum of SHAP value magnitudes over all samples (and
            # classes), one number per feature.
            magnitudes = np.abs(contributions).sum(axis=tuple(range(contributions.ndim - 1)))
            for i in average:
                self._save(AVERAGE_SHAP_PREFIX + features[i], magnitudes[i : i + 1])

    # -- saving ---------------------------------------------------------------------------------------
    def _save(self, name: str, value) -> None:
        if not self.is_due(name):
            return
        array = np.asarray(value)
        if array.dtype.kind in "USO":  # reductions are for numbers: text is saved as it is
            self._queue(name, array)
        else:
            self._write_for_tensor(name, array, self._due.intersection(self._collections_of(name)))
        for coll in self._collections_of(name):  # the collections file lists what was saved
            coll.add_tensor_name(name)

    def _any_due_prefix(self, prefix: str) -> bool:
        """Whether a tensor of this prefix may be due: its collection, or any due collection with
        patterns of the user's (the default and all collections, custom ones)."""
        return any(
            c.name not in BUILTIN_PATTERNS or any(p.startswith("^" + prefix) for p in c.include_regex)
            for c in self._due
        )

    def _is_tree_booster(self, model, what: str) -> bool:
        kind = self._training.booster(model)
        if kind not in TREE_BOOSTERS:
            self._warn_once(f"booster:{what}", "smdebug: %s are not defined for booster %r", what, kind)
            return False
        return True

    def _guard(self, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._warn_once(
                what,
                "smdebug: could not save %s at step %d: %s: %s",
                what,
                self.step,
                type(exc).__name__,
                exc,
            )

    def _warn_once(self, key: str, message: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    # -- ending -----------------------------------------------------------------------------------------
    def _flush(self) -> None:
        """Make everything saved so far readable (the run stays open for more training)."""
        if self._in_step:
            self.end_step()
        if self._writer is not None:
            self._export_collections()
            self._writer.flush()

    def _finish_copy(self) -> None:
        """A Dask worker's copy: write its steps and collections; the end-of-job mark is the
        original's to write when it closes (once every worker is done)."""
        if self._in_step:
            self.end_step()
        self._closed = True
        if self._writer is not None:
            self._export_collections()
            failed = self._writer.close()
            if failed:
                logger.warning(
                    "smdebug: %s could not save steps %s to %s", self.worker, sorted(failed), self.out_dir
                )
        plugins.hook().smdebug_hook_closed(hook=self)  # exporters (TensorBoard) close with it

    def close(self) -> None:
        was_closed = self._closed
        super().close()
        if not was_closed and self._shipped and self._writer is None and not self.dry_run:
            try:  # only the workers wrote: mark the run as finished for them
                plugins.open_store(self.out_dir).write_bytes(END_OF_JOB_FILE, b"")
            except Exception as exc:
                logger.warning("smdebug: could not mark %s as finished: %s", self.out_dir, exc)

    # -- copies -----------------------------------------------------------------------------------------
    def __copy__(self):
        return self  # a hook is a handle on its run (sklearn's clone deep-copies estimator parameters)

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        """Pickled (by Dask, for its workers): the configuration, rebuilt into a hook on the other side."""
        self._shipped = True
        data = {}
        for argument, value in self._data_arguments.items():
            if isinstance(value, xgb.DMatrix):
                self._warn_once(
                    f"ship:{argument}",
                    "smdebug: %s is a DMatrix of this process and stays here; workers get none (give a "
                    "(file path, content type) tuple for them to load)",
                    argument,
                )
                value = None
            data[argument] = value
        kwargs = dict(
            out_dir=self.out_dir,
            export_tensorboard=self.export_tensorboard,
            tensorboard_dir=self.tensorboard_dir,
            dry_run=self.dry_run,
            reduction_config=self.reduction_config,
            save_config=self.save_config,
            include_collections=list(self.include_collections),
            include_workers=self.include_workers,
            hyperparameters=self.hyperparameters,
            max_queue_bytes=self.max_queue_bytes,
            **data,
        )
        first_step = max(self._rounds_done, self.step + 1)  # the workers' rounds go on from here
        return (_restore, (kwargs, self.collection_manager, first_step))


def _restore(kwargs: dict, collection_manager, first_step: int = 0) -> Hook:
    hook = Hook.__new__(Hook)
    hook._is_copy = True
    hook.__init__(**kwargs)
    hook.collection_manager = collection_manager
    hook._colls_of.clear()
    hook._rounds_done = first_step
    return hook


class _Training:
    """What the hook learns once per training: the parameters it was given and the booster type."""

    def __init__(self, params):
        self.params = _normalise_params(params) if params is not None else None
        self._config: dict | None = None

    def _learner(self, model) -> dict:
        if self._config is None:
            self._config = json.loads(model.save_config()).get("learner", {})
        return self._config

    def booster(self, model) -> str:
        return str(self._learner(model).get("gradient_booster", {}).get("name", "gbtree"))

    def config_params(self, model) -> dict:
        """Every parameter in the booster's configuration (when the train call's are unknown)."""
        found: dict[str, Any] = {}

        def walk(node, in_params: bool) -> None:
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, value in items:
                if isinstance(value, (dict, list)):
                    walk(value, isinstance(key, str) and key.endswith("_param"))
                elif in_params and isinstance(value, str):
                    found.setdefault(key, _number(value))

        walk(self._learner(model), False)
        return found


def _params_of_train_call():
    """The ``params`` of the xgboost.train (or xgboost.cv) call running this callback."""
    frame = sys._getframe(1)
    for _ in range(10):
        if frame is None:
            return None
        if frame.f_code.co_name in ("train", "cv") and frame.f_globals.get("__name__") == "xgboost.training":
            return frame.f_locals.get("params")
        frame = frame.f_back
    return None


def _normalise_params(params) -> dict:
    """A dict of the parameters given (xgboost also takes a list of pairs, repeating a key for lists)."""
    pairs = params.items() if isinstance(params, Mapping) else list(params)
    found: dict[str, Any] = {}
    for key, value in pairs:
        if value is None:  # xgboost ignores None (the scikit-learn wrapper passes its unset ones)
            continue
        if key in found:
            previous = found[key]
            found[key] = [*(previous if isinstance(previous, list) else [previous]), value]
        else:
            found[key] = value
    return found


def _param_array(value) -> np.ndarray:
    scalar = (bool, int, float, str, np.generic)
    if isinstance(value, scalar):
        return np.array([value])
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, scalar) for v in value):
        return np.array(value)
    return np.array([str(value)])


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _feature_names(model) -> list[str]:
    names = model.feature_names
    return list(names) if names is not None else [f"f{i}" for i in range(model.num_features())]
