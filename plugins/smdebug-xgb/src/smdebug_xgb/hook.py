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

import itertools
import json
import logging
import os
import re
import sys
import weakref
from collections import Counter
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import xgboost as xgb
from pydantic import field_validator

from smdebug.plugin import (
    BaseHook,
    CollectionKeys,
    ConfigError,
    HookConfig,
    ModeKeys,
    ReductionConfig,
    SaveConfig,
)
from smdebug_xgb.collection import (
    AVERAGE_SHAP_PREFIX,
    BIAS,
    BUILTIN_PATTERNS,
    FEATURE_IMPORTANCE_PREFIX,
    FULL_SHAP_PREFIX,
    HYPERPARAMETERS_PREFIX,
    IMPORTANCE_TYPES,
    LABELS,
    LOSS_METRIC,
    PREDICTIONS,
    TREE_COLUMNS,
    TREES_PREFIX,
    XGBOOST_COLLECTIONS,
)
from smdebug_xgb.data import load_data, one_line
from smdebug_xgb.trees import tree_columns

logger = logging.getLogger("smdebug")

TREE_BOOSTERS = ("gbtree", "dart")
# this process's hooks that are no copies, by their origin's number: a copy unpickled where its original
# lives (pickle.loads of a model, in the process that pickled it) trains as that original
_ORIGINALS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_NUMBERS = itertools.count()


class XGBoostHookConfig(HookConfig):
    """The XGBoost hook's options: the common ones, then smdebug 1.0's three of its own."""

    hyperparameters: Optional[dict[str, Any]] = None
    train_data: Any = None  # a DMatrix, or (file path, content type)
    validation_data: Any = None

    @field_validator("hyperparameters", mode="before")
    @classmethod
    def _hyperparameters(cls, v):
        if v is not None and not isinstance(v, Mapping):
            raise ConfigError(f"hyperparameters: expected a dict, got {type(v).__name__}")
        return None if v is None else dict(v)

    @field_validator("health", mode="after")
    @classmethod
    def _health(cls, v):
        # The core's flight recorder would claim every round watched (and hook signal handlers) while no
        # plugin feeds it: XGBoost has no weights or gradients to watch. Off before the hook makes it.
        if v:
            logger.warning(
                "smdebug: health=True is ignored by the XGBoost hook: health watches PyTorch, Keras and "
                "MXNet training only"
            )
        return False


class Hook(BaseHook, xgb.callback.TrainingCallback):
    framework = "xgboost"
    options_class = XGBoostHookConfig
    builtin_collections = XGBOOST_COLLECTIONS
    builtin_patterns = BUILTIN_PATTERNS
    default_include_collections = (CollectionKeys.METRICS,)
    default_save_config = SaveConfig(save_interval=10)  # smdebug 1.0's XGBoost default
    stops_together = True  # (after_iteration's allreduce: every worker stops at the same round)
    scalar_collections = BaseHook.scalar_collections | {
        CollectionKeys.FEATURE_IMPORTANCE,
        CollectionKeys.AVERAGE_SHAP,
    }

    def setup(self) -> None:
        options = self.options
        self.hyperparameters = options.hyperparameters or None
        self.train_data = load_data("train_data", options.train_data)
        self.validation_data = load_data("validation_data", options.validation_data)
        self._no_validation_data = "no validation_data was given to the hook"  # (activation may say more)
        if options.reduction_config is not None:
            # smdebug 1.0's XGBoost page: "Not supported in XGBoost and will be ignored" (a collection's
            # own reduction_config still applies)
            if not self.is_copy:
                logger.warning(
                    "smdebug: reduction_config is ignored by the XGBoost hook: tensors are saved whole"
                )
            self.reduction_config = ReductionConfig(save_raw_tensor=True)
        # rounds seen by this hook, so a second training continues the steps (a restarted job: after the
        # checkpointed step)
        self._rounds_done = self.step + 1
        self._round_offset = self._mode_offset = 0
        self._training: _Training | None = None
        self._round: int | None = None  # the step before_iteration began (after_iteration saves it)
        # (booster, evals log, rounds before it) of that round, for after_training when the hook's
        # after_iteration was skipped (not "_pending": the core's reductions use that name)
        self._unsaved_round = None
        self._stray = False  # a copy training outside distributed training: it saves nothing
        # (process id, number) of the hook a copy was made from; the original, when a copy trains as it
        self._origin: tuple[int, int] | None = None
        self._original: Hook | None = None
        if not self.is_copy:
            self._origin = (os.getpid(), next(_NUMBERS))
            _ORIGINALS[self._origin[1]] = self
        # the rules added by name or class, with their action and parameters: Dask's workers add them again
        self._rules: list[tuple] = []
        self._built_rules = 0  # rules added already built (a Rule object stays in this process)
        self._rules_to_add: list[tuple] = []  # a copy's, from its original (copy_state)

    @classmethod
    def hook_from_config(cls, json_config_path: str | None = None):
        """smdebug 1.0's older name of ``create_from_json_file``."""
        return cls.create_from_json_file(json_config_path)

    @property
    def rule_results(self) -> list:
        """Every firing of the hook's rules so far. Under ``xgboost.dask`` the workers' copies judge the
        rounds: their firings, read from the run, come after this hook's own."""
        own = BaseHook.rule_results.fget(self)
        if not self.shipped or self.is_copy or self.dry_run:
            return own
        from smdebug.rules.runner import RuleResult
        from smdebug.trials import create_trial

        try:
            firings = create_trial(self.out_dir).rule_firings()
        except Exception as exc:  # no run yet, or one that cannot be read now
            logger.debug("smdebug: the workers' rule firings could not be read: %s", exc)
            return own
        left = Counter((r.rule, r.step, r.reason) for r in own)  # this process's, recorded there too
        for firing in firings:
            key = (firing["rule"], firing["step"], firing["reason"])
            if left[key]:
                left[key] -= 1
            else:
                own.append(RuleResult(*key))
        return own

    def add_rule(self, rule, action: str | None = "stoptraining", **params):
        built = super().add_rule(rule, action, **params)
        if isinstance(rule, (str, type)):
            self._rules.append((rule, action, params))
        else:
            self._built_rules += 1
        return built

    # -- distributed training: XGBoost's collective (Dask, Spark, ...) ------------------------------
    def worker_name(self) -> str:
        return f"worker_{xgb.collective.get_rank()}"

    def num_workers(self) -> int:
        return xgb.collective.get_world_size()

    # -- xgboost.callback.TrainingCallback --------------------------------------------------------------
    def before_training(self, model):
        # Rounds are steps 0, 1, ... as in smdebug 1.0 (a save_scalar made before training joins step 0);
        # a second training with this hook goes on after the first one's rounds. In TRAIN (or another)
        # mode, the mode's steps start at its own count, whatever GLOBAL steps came before.
        if self.is_copy and not xgb.collective.is_distributed():
            self._original = self._original_here()
        if self._original is not None:
            return self._original.before_training(model)
        if self.closed:
            self.warn_once(
                "closed",
                "smdebug: the hook was closed (its run at %s is finished): the rounds of this training "
                "are not saved; give it a new hook to save them",
                self.out_dir,
            )
        if self.is_copy and not self.closed and not xgb.collective.is_distributed():
            # pickled into a process of its own outside XGBoost's collective (joblib, multiprocessing:
            # GridSearchCV(n_jobs=2)): every such copy is worker_0 and would write over the others' steps
            self._stray = True
            if self._origin is not None and self._origin[0] == os.getpid():
                self.warn_once(
                    "stray",
                    "smdebug: a copy of the hook (unpickled) trains after its original hook was deleted: "
                    "the rounds trained here are not saved to %s; give the model a new hook to save them",
                    self.out_dir,
                )
            else:
                self.warn_once(
                    "stray",
                    "smdebug: the hook was copied into another process (joblib or multiprocessing, e.g. "
                    "n_jobs > 1) outside distributed training: the rounds trained here are not saved to %s; "
                    "train in the hook's own process (n_jobs=1) to save them",
                    self.out_dir,
                )
        if self.is_copy and not self._stray and self._rules_to_add:
            # a Dask worker's copy judges the rounds it saves with its original's rules (a rule that
            # fires on any worker stops them all: after_iteration)
            rules, self._rules_to_add = self._rules_to_add, []
            for rule, action, params in rules:
                with self.guard("add a rule"):
                    self.add_rule(rule, action, **params)
        if self.mode == ModeKeys.GLOBAL:
            self._round_offset = self._mode_offset = self._rounds_done
        else:
            self._round_offset = max(self._rounds_done, self.step + 1)
            self._mode_offset = self.mode_steps.get(self.mode, -1) + 1
        self._training = _Training(_params_of_train_call())
        return model

    def before_iteration(self, model, epoch: int, evals_log) -> bool:
        if self._original is not None:
            return self._original.before_iteration(model, epoch, evals_log)
        # The round's step begins before any callback's after_iteration: a checkpoint that another
        # callback (xgboost's TrainingCheckPoint) writes in this round, listed before or after the hook,
        # is recorded as of this round when the next one begins (or the hook closes).
        if not (self.closed or self._stray):
            with self.guard("start a boosting round"):
                self._begin_round(model, epoch)
                # xgboost updates this booster and log in place; a callback listed before the hook that
                # stops boosting (EarlyStopping) keeps the hook's after_iteration from being called
                self._unsaved_round = (model, evals_log, model.num_boosted_rounds())
        return False

    def after_iteration(self, model, epoch: int, evals_log) -> bool:
        if self._original is not None:
            return self._original.after_iteration(model, epoch, evals_log)
        self._unsaved_round = None
        if self._stray:
            return False
        if not self.closed:
            with self.guard("save a boosting round"):
                self._save_round(model, epoch, evals_log)
        # True stops boosting: a rule added with hook.add_rule fired, or the run's stop signal was left.
        stop = not self.closed and self.should_stop()
        if xgb.collective.is_distributed():
            # every worker stops at the same round (each looks for the stop signal at its own moment):
            # the workers going on alone would fail in their next allreduce
            stop = bool(xgb.collective.allreduce(np.array([stop], dtype=np.int32), xgb.collective.Op.MAX)[0])
        if stop:
            reason = self.stop_reason or "another worker's hook was asked to stop"
            logger.warning("smdebug: boosting stopped after round %d: %s", epoch, reason)
        return stop

    def after_training(self, model):
        if self._original is not None:
            original, self._original = self._original, None
            return original.after_training(model)
        if self._unsaved_round is not None and self._round is not None and not self.closed:
            booster, evals_log, rounds_before = self._unsaved_round
            if booster.num_boosted_rounds() > rounds_before:
                # the last round, which another callback stopped on before the hook's turn: saved from the
                # booster as that round left it (EarlyStopping(save_best=True) hands on a shorter copy)
                with self.guard("save a boosting round"):
                    self._save_round(booster, self._round - self._round_offset, evals_log)
            else:
                # a callback's before_iteration stopped boosting before this round was trained: its step
                # saves nothing, and the next training's rounds begin at it
                self._rounds_done = self._round
        self._unsaved_round = None
        # A Dask worker's copy is done (the end-of-job marker is its original's to write, once every
        # worker is done); the original's run stays open for more training.
        self.close() if self.is_copy else self.flush()
        self._training = None
        return model

    # -- one boosting round -------------------------------------------------------------------------
    def _begin_round(self, model, epoch: int) -> None:
        if self._training is None:  # called without before_training (a hand-written training loop)
            self.before_training(model)
        step = self._round_offset + epoch
        self._rounds_done = max(self._rounds_done, step + 1)
        self.begin_step(step, mode_step=self._mode_offset + epoch)
        self._round = step

    def _save_round(self, model, epoch: int, evals_log) -> None:
        if self._training is None or self._round != self._round_offset + epoch:  # no before_iteration
            self._begin_round(model, epoch)
        self._round = None
        try:
            if not self.anything_due():
                return
            with self.guard("save metrics"):
                self._save_metrics(evals_log)
            with self.guard("save hyperparameters"):
                self._save_hyperparameters(model)
            if not isinstance(model, xgb.Booster):  # xgboost.cv hands callbacks a pack of boosters
                self.warn_once("cv", "smdebug: with xgboost.cv only metrics and hyperparameters are saved")
                return
            for what, save in (
                ("save predictions", self._save_predictions),
                ("save feature importance", self._save_feature_importance),
                ("save trees", self._save_trees),
                ("save SHAP values", self._save_shap),
            ):
                with self.guard(what):
                    save(model)
        finally:
            self.end_step()

    def _save_metrics(self, evals_log) -> None:
        metrics = self.get_collections()[CollectionKeys.METRICS]
        for data_name, results in evals_log.items():
            for metric, history in results.items():
                if not history:
                    continue
                value = history[-1]
                if isinstance(value, tuple):  # xgboost.cv: (mean, std) over the folds
                    value = value[0]
                name = f"{data_name}-{metric}"
                if not metrics.matches(name):  # an eval name with "/" in it is a metric all the same
                    self.add_to_collection(CollectionKeys.METRICS, name)
                    if re.fullmatch(LOSS_METRIC, metric):  # and a falling one a loss
                        self.add_to_collection(CollectionKeys.LOSSES, name)
                self.save_for_step(name, np.array([float(value)]))

    def _save_hyperparameters(self, model) -> None:
        if not self._any_due_prefix(HYPERPARAMETERS_PREFIX):
            return
        params = self.hyperparameters or self._training.params
        if params is None:
            params = self._training.config_params(model) if isinstance(model, xgb.Booster) else {}
        for key, value in params.items():
            self.save_for_step(HYPERPARAMETERS_PREFIX + str(key), _param_array(value))

    def _save_predictions(self, model) -> None:
        due = [name for name in (PREDICTIONS, LABELS) if self.is_due(name)]
        if not due:
            return
        if self.validation_data is None:
            self._cannot_save("validation", due, self._no_validation_data)
            return
        if PREDICTIONS in due:
            predictions = self._predict(
                model, self.validation_data, [PREDICTIONS], "predict on validation_data"
            )
            if predictions is not None:
                self.save_for_step(PREDICTIONS, predictions)
        if LABELS in due:
            self.save_for_step(LABELS, self.validation_data.get_label())

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
                self.save_for_step(prefix + feature, np.array([score / total]))

    def _save_trees(self, model) -> None:
        due = [c for c in TREE_COLUMNS if self.is_due(TREES_PREFIX + c)]
        if not due or not self._is_tree_booster(model, "trees"):
            return
        rounds = model.num_boosted_rounds()
        try:
            dumps = model.get_dump(with_stats=True, dump_format="json")
        except xgb.core.XGBoostError as exc:  # e.g. multi-target trees (multi_strategy="multi_output_tree")
            reason = f"could not dump the trees: {one_line(exc)}"
            self._cannot_save("trees", [TREES_PREFIX + c for c in due], reason)
            return
        per_round = len(dumps) // rounds if rounds else 0
        first = (rounds - 1) * per_round  # the trees this round added
        try:
            columns = tree_columns(dumps[first : first + per_round], first)
        except (KeyError, TypeError, ValueError) as exc:  # a dump of a form not known here
            reason = f"could not read the trees' JSON dump: {one_line(exc)}"
            self._cannot_save("trees", [TREES_PREFIX + c for c in due], reason)
            return
        for column in due:
            self.save_for_step(TREES_PREFIX + column, columns[column])

    def _save_shap(self, model) -> None:
        features = [*_feature_names(model), BIAS]
        clash = BIAS in features[:-1]
        if clash:
            # a feature named "bias" keeps its name: its values are saved as <shap collection>/bias, in
            # the shap collections (whose patterns leave the bias column out), and the bias column is not
            del features[-1]
            for key, prefix in (
                (CollectionKeys.FULL_SHAP, FULL_SHAP_PREFIX),
                (CollectionKeys.AVERAGE_SHAP, AVERAGE_SHAP_PREFIX),
            ):
                if not self.get_collections()[key].has_tensor_name(prefix + BIAS):
                    self.add_to_collection(key, prefix + BIAS)
        full = [i for i, f in enumerate(features) if self.is_due(FULL_SHAP_PREFIX + f)]
        average = [i for i, f in enumerate(features) if self.is_due(AVERAGE_SHAP_PREFIX + f)]
        if not (full or average):
            return
        if clash:
            self.warn_once(
                "bias",
                "smdebug: a feature is named %r, as the SHAP bias column: full_shap/bias and "
                "average_shap/bias hold that feature's SHAP values; the bias column is not saved",
                BIAS,
            )
        names = [FULL_SHAP_PREFIX + features[i] for i in full] + [
            AVERAGE_SHAP_PREFIX + features[i] for i in average
        ]
        if self.train_data is None:
            self._cannot_save("train_data", names, "no train_data was given to the hook (SHAP values)")
            return
        contributions = self._predict(
            model, self.train_data, names, "compute SHAP values on train_data", pred_contribs=True
        )
        if contributions is None:
            return
        for i in full:  # as smdebug 1.0: each feature's tensor holds the whole matrix
            self.save_for_step(FULL_SHAP_PREFIX + features[i], contributions)
        if average:
            # The reference's definition: the sum of SHAP value magnitudes over all samples (and
            # classes), one number per feature.
            magnitudes = np.abs(contributions).sum(axis=tuple(range(contributions.ndim - 1)))
            for i in average:
                self.save_for_step(AVERAGE_SHAP_PREFIX + features[i], magnitudes[i : i + 1])

    # -- saving ---------------------------------------------------------------------------------------
    def _cannot_save(self, key: str, names, reason: str) -> None:
        """Say once why these due tensors are not saved, and record it in the run (``smdebug ls``)."""
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        self.warn_once(key, "smdebug: %s not saved: %s", shown, reason)
        for name in names:
            self.record_unsaved_tensor(name, reason)

    def _predict(self, model, data, names, what: str, **kwargs):
        """``model.predict(data)``, or None when xgboost refuses the data (more columns than the booster's
        features, other feature names; for SHAP values any other width): then these tensors are not
        saved, said in one line (xgboost's message runs on with its native stack trace)."""
        columns, features = data.num_col(), model.num_features()
        if kwargs.get("pred_contribs") and columns != features:
            # (predictions take fewer columns: a sparse libsvm file's last features may never appear)
            reason = f"train_data has {columns} columns, the booster {features} features"
            self._cannot_save("width:train_data", names, reason)
            return None
        try:
            return model.predict(data, **kwargs)
        except (xgb.core.XGBoostError, ValueError) as exc:
            self._cannot_save(f"predict:{what}", names, f"could not {what}: {one_line(exc)}")
            return None

    def _any_due_prefix(self, prefix: str) -> bool:
        """Whether a tensor of this prefix may be due: its collection, or any due collection with
        patterns of the user's (the default and all collections, custom ones)."""
        return any(
            c.name not in BUILTIN_PATTERNS or any(p.startswith("^" + prefix) for p in c.include_regex)
            for c in self.due_collections
        )

    def _is_tree_booster(self, model, what: str) -> bool:
        kind = self._training.booster(model)
        if kind not in TREE_BOOSTERS:
            self.warn_once(f"booster:{what}", "smdebug: %s are not defined for booster %r", what, kind)
            return False
        return True

    # -- copies -----------------------------------------------------------------------------------------
    def _original_here(self) -> Hook | None:
        """The hook this copy was made from, when it lives in this process."""
        if self._origin is None or self._origin[0] != os.getpid():
            return None
        return _ORIGINALS.get(self._origin[1])

    def __copy__(self):
        return self  # a hook is a handle on its run (sklearn's clone deep-copies estimator parameters)

    def __deepcopy__(self, memo):
        return self

    def copy_options(self) -> XGBoostHookConfig:
        """What Dask's workers get: a DMatrix of this process stays here (a file tuple travels)."""
        dropped = {}
        for argument in ("train_data", "validation_data"):
            if isinstance(getattr(self.options, argument), xgb.DMatrix):
                self.warn_once(
                    f"ship:{argument}",
                    "smdebug: %s is a DMatrix of this process and stays here; workers get none (give a "
                    "(file path, content type) tuple for them to load)",
                    argument,
                )
                dropped[argument] = None
        if self._built_rules:
            self.warn_once(
                "ship:rules",
                "smdebug: %d rule(s) added already built stay in this process; workers judge their rounds "
                "only with rules added by name or class (hook.add_rule('tree_depth', depth=4))",
                self._built_rules,
            )
        return self.options.model_copy(update=dropped)

    def copy_state(self) -> dict:
        # the workers' rounds go on from here, judged by the rules this hook was given (a copy can be
        # pickled again before its training, with them still to add)
        rules = [*self._rules, *self._rules_to_add]
        return {
            "_rounds_done": max(self._rounds_done, self.step + 1),
            "_rules_to_add": rules,
            "_origin": self._origin,
        }


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
