"""BaseHook: the framework-neutral part of every hook.

It keeps the step and per-mode step counters, decides which collections and tensors are due at the
current step, computes reductions (through the reduction hooks, so a plugin reduces where the tensor
lives) and hands host arrays to the off-thread writer. A framework plugin subclasses it and only adapts
its framework: it calls ``begin_step``/``end_step`` at step boundaries and ``save_for_step`` for every
tensor it sees.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from smdebug import plugins
from smdebug.collection import (
    SCALAR_COLLECTIONS,
    TRAIN_ONLY_COLLECTIONS,
    Collection,
    CollectionKeys,
    CollectionManager,
)
from smdebug.config import ReductionConfig, SaveConfig, SaveConfigMode
from smdebug.exceptions import ConfigError, OutDirExistsError, SMDebugTypeError
from smdebug.modes import ModeKeys, to_mode
from smdebug.reductions import reduction_tensor_name
from smdebug.store import Store, redact
from smdebug.writer import END_OF_JOB_FILE, RunWriter, at_exit, collections_file_path, existing_run

logger = logging.getLogger("smdebug")

SCALAR_PREFIX = "scalar/"
DEFAULT_WORKER = "worker_0"
_active_hook: BaseHook | None = None


def get_hook() -> BaseHook | None:
    """The hook most recently created in this process (auto-activated or user-made), if any."""
    return _active_hook


class BaseHook:
    # What a framework plugin may override.
    framework: str = ""
    collection_class: type[Collection] = Collection
    default_include_collections: tuple[str, ...] = ()  # always saved, whatever the configuration
    builtin_collections: tuple[str, ...] = (
        CollectionKeys.ALL,
        CollectionKeys.DEFAULT,
        CollectionKeys.WEIGHTS,
        CollectionKeys.BIASES,
        CollectionKeys.GRADIENTS,
        CollectionKeys.LOSSES,
    )

    def __init__(
        self,
        out_dir: str | None = None,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config: ReductionConfig | None = None,
        save_config: SaveConfig | SaveConfigMode | None = None,
        include_regex: Iterable[str] | str | None = None,
        include_collections: Iterable[str] | str | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        *,
        max_queue_bytes: int | None = None,
    ):
        global _active_hook
        if not out_dir or not isinstance(out_dir, str):
            raise ConfigError(f"out_dir: a path or URI is required, got {out_dir!r}")
        if include_workers not in ("one", "all"):
            raise ConfigError(f"include_workers: invalid value {include_workers!r} (expected 'one' or 'all')")
        if reduction_config is not None and not isinstance(reduction_config, ReductionConfig):
            raise ConfigError(
                f"reduction_config: expected a ReductionConfig, got {type(reduction_config).__name__}"
            )
        self.out_dir = out_dir.rstrip("/") if len(out_dir) > 1 else out_dir
        self.export_tensorboard = bool(export_tensorboard)
        self.tensorboard_dir = tensorboard_dir or (
            f"{self.out_dir}/tensorboard" if export_tensorboard else None
        )
        self.dry_run = bool(dry_run)
        self.save_all = bool(save_all)
        self.include_workers = include_workers
        self.save_config = SaveConfig.parse(save_config)
        # Without a reduction config tensors are saved as they are.
        self.reduction_config = reduction_config or ReductionConfig(save_raw_tensor=True)
        self.include_regex = [include_regex] if isinstance(include_regex, str) else list(include_regex or [])
        include = [include_collections] if isinstance(include_collections, str) else include_collections
        self.include_collections = list(dict.fromkeys([*(include or []), *self.default_include_collections]))
        self.max_queue_bytes = max_queue_bytes

        self._colls_of: dict[str, frozenset[Collection]] = {}
        self._prepared = False
        self.collection_manager = CollectionManager()
        for name in self.builtin_collections:
            self.collection_manager.get(name, cls=self.collection_class)
        if self.include_regex:
            self.get_collection(CollectionKeys.DEFAULT).include(self.include_regex)
            self._include(CollectionKeys.DEFAULT)
        if self.save_all:
            self.get_collection(CollectionKeys.ALL).include(".*")
            self._include(CollectionKeys.ALL)

        self.mode = ModeKeys.GLOBAL
        self.step = -1  # the first begin_step makes it 0
        self.mode_steps: dict[ModeKeys, int] = {ModeKeys.GLOBAL: -1}
        self._in_step = False
        self._due: set[Collection] = set()
        self._saved_any = False
        self._collections_exported = False
        self._writer: RunWriter | None = None
        self._store: Store | None = None
        self._closed = False
        self.worker = DEFAULT_WORKER
        self._check_out_dir()
        from smdebug.rules.actions import RuleRunner

        self._rules = RuleRunner(self)  # rules evaluated at step end, and the stop signal
        _active_hook = self  # closed at interpreter exit once it writes (_get_writer)
        logger.info("smdebug: saving to %s", redact(self.out_dir))

    # -- what a framework plugin may override ------------------------------------------------------
    def _get_worker_name(self) -> str:
        return DEFAULT_WORKER

    def _get_num_workers(self) -> int:
        return 1

    def _to_numpy(self, value: Any) -> np.ndarray:
        if np.isscalar(value) and not isinstance(value, np.generic):  # as smdebug 1.0: a Python scalar
            return np.array([value])  # is saved with shape (1,)
        array = plugins.to_numpy(value)
        if array is None:
            raise SMDebugTypeError(f"cannot convert a {type(value).__name__} to a numpy array")
        return array

    def _reduce(self, value: Any, reduction: str, abs: bool) -> float:
        result = plugins.reduce(value, reduction, abs)
        if result is None:
            raise SMDebugTypeError(f"no plugin can compute {reduction} of a {type(value).__name__}")
        return result

    # -- common hook API (reference: Common Hook API) ----------------------------------------------
    def get_collection(self, name: str, create: bool = True) -> Collection:
        coll = self.collection_manager.get(name, create=create, cls=self.collection_class)
        self._colls_of.clear()
        return coll

    def get_collections(self) -> dict[str, Collection]:
        return self.collection_manager.collections

    def add_collection(self, collection: Collection) -> None:
        if not isinstance(collection, Collection):
            raise SMDebugTypeError(f"add_collection expects a Collection, got {type(collection).__name__}")
        self.collection_manager.add(collection)
        self._colls_of.clear()

    def set_mode(self, mode) -> None:
        try:
            mode = to_mode(mode)
        except ValueError as exc:
            raise ConfigError(f"set_mode: {exc}") from None
        if mode != self.mode and self._in_step:
            self.end_step()
        self.mode = mode
        self.mode_steps.setdefault(mode, -1)

    def save_scalar(self, name: str, value, sm_metric: bool = False, timestamp: float | None = None) -> None:
        """Save a scalar at the current step, whatever the save configuration."""
        array = np.asarray(self._to_numpy(value))
        if array.size != 1:
            raise SMDebugTypeError(f"save_scalar({name!r}): value has {array.size} elements, expected one")
        self._write_now(SCALAR_PREFIX + name, array, None)  # a 0-d tensor stays 0-d, as in smdebug 1.0

    def save_tensor(self, tensor_name: str, tensor_value, collections_to_write="default") -> None:
        """Save a tensor at the current step into the given collections, whatever their save config."""
        names = (
            [collections_to_write] if isinstance(collections_to_write, str) else list(collections_to_write)
        )
        colls = []
        for cname in names:
            coll = self.get_collection(cname)
            coll.add_tensor_name(tensor_name)
            self._include(cname)
            colls.append(coll)
        self._write_now(tensor_name, tensor_value, colls)

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None):
        """Build a hook from the SageMaker JSON configuration (None when there is none)."""
        from smdebug.json_config import find_config_path, load_hook_config

        path = find_config_path(json_file_path)
        if path is None:
            logger.info("smdebug: no hook configuration found, no hook created")
            return None
        return cls.from_config(load_hook_config(path))

    @classmethod
    def from_config(cls, config, **kwargs):
        hook = cls(
            out_dir=config.out_dir,
            export_tensorboard=config.export_tensorboard,
            tensorboard_dir=config.tensorboard_dir,
            dry_run=config.dry_run,
            reduction_config=config.reduction_config,
            save_config=config.save_config,
            include_regex=config.include_regex,
            include_collections=config.include_collections,
            save_all=config.save_all,
            include_workers=config.include_workers,
            **kwargs,
        )
        for name, settings in config.collections.items():
            coll = hook.get_collection(name)
            if settings.include_regex:
                coll.include(settings.include_regex)
            if settings.save_config is not None:
                coll.save_config = settings.save_config
            if settings.reduction_config is not None:
                coll.reduction_config = settings.reduction_config
            if settings.save_histogram is not None:
                coll.save_histogram = settings.save_histogram
        return hook

    # -- rules and stopping training (smdebug.rules.actions) ---------------------------------------
    def add_rule(self, rule, action: str | None = "stoptraining", **params):
        """Evaluate a rule at the end of every saved step: a built-in rule's name with its parameters
        (``hook.add_rule("loss_not_decreasing", num_steps="5")``), a Rule subclass, or a built rule.
        With action "stoptraining" (the default) training stops when it fires; None only logs."""
        return self._rules.add(rule, action, params)

    def should_stop(self) -> bool:
        """Whether a rule, or the run's stop signal, asked training to stop."""
        return self._rules.stop is not None

    @property
    def stop_reason(self):
        """The StopTraining exception describing why training should stop, or None."""
        return self._rules.stop

    @property
    def rule_results(self) -> list:
        """Every firing of the hook's rules so far (RuleResult: rule, step, reason)."""
        return list(self._rules.results)

    def _raise_if_stop_requested(self) -> None:
        """Raise StopTraining once, the first time a framework plugin asks after a stop was requested."""
        stop = self._rules.pending_stop()
        if stop is not None:
            raise stop

    def close(self) -> None:
        """End the current step, write everything still queued and mark the run as finished."""
        if self._closed:
            return
        self._closed = True
        if self._in_step:
            self.end_step()
        if self._writer is not None:
            self._export_collections()
            self._writer.write_file(END_OF_JOB_FILE, b"")
            self._writer.close()
            unsaved = self._writer.unsaved_report()
            if unsaved:
                logger.warning("smdebug: saving to %s is incomplete: %s", self._writer.store.uri, unsaved)
        plugins.hook().smdebug_hook_closed(hook=self)

    # -- step boundaries (called by framework plugins) ---------------------------------------------
    def begin_step(self) -> None:
        if self._in_step:
            self.end_step()
        if not self._prepared:
            self._prepare()
        self.step += 1
        self.mode_steps[self.mode] = self.mode_steps.get(self.mode, -1) + 1
        if self.mode != ModeKeys.GLOBAL:
            self.mode_steps[ModeKeys.GLOBAL] = self.step
        self._in_step = True
        self._due = self._collections_due()
        plugins.hook().smdebug_step_begin(hook=self, mode=self.mode, step=self.step, mode_step=self.mode_step)

    def end_step(self) -> None:
        if not self._in_step:
            return
        self._in_step = False
        if self._writer is not None:
            self._writer.end_step(self.step)
            if self._saved_any and not self._collections_exported:
                self._export_collections()
        plugins.hook().smdebug_step_end(hook=self, mode=self.mode, step=self.step, mode_step=self.mode_step)
        self._rules.step_ended(self.step)

    @property
    def mode_step(self) -> int:
        return self.mode_steps.get(self.mode, -1)

    # -- deciding what to save ---------------------------------------------------------------------
    def _include(self, name: str) -> None:
        if name not in self.include_collections:
            self.include_collections.append(name)
            self._prepared = False

    def _included(self) -> list[Collection]:
        collections = self.collection_manager.collections
        if CollectionKeys.ALL in self.include_collections:
            return list(collections.values())
        # _prepare created every included collection; not get_collection, which empties _colls_of
        return [collections[n] for n in self.include_collections if n in collections]

    def _prepare(self) -> None:
        """Give every collection its effective configs (its own, completed by the hook's)."""
        self.worker = self._get_worker_name()
        for name in self.include_collections:
            self.collection_manager.get(name, cls=self.collection_class)
        for coll in self.collection_manager.collections.values():
            coll.save_config.merge_default_save_config(self.save_config)
            if coll.name in SCALAR_COLLECTIONS:
                coll.reduction_config = ReductionConfig(save_raw_tensor=True)
                coll.save_histogram = False
            elif coll.reduction_config is None:
                coll.reduction_config = self.reduction_config
        for coll in self._included():
            if coll.name not in self.builtin_collections and not (coll.include_regex or coll.tensor_names):
                logger.warning("smdebug: collection %r has no include_regex or tensor names", coll.name)
        self._colls_of.clear()
        self._prepared = True

    def _collections_due(self) -> set[Collection]:
        training = self.mode not in (ModeKeys.EVAL, ModeKeys.PREDICT)
        return {
            c
            for c in self._included()
            if (training or c.name not in TRAIN_ONLY_COLLECTIONS)
            and c.save_config.should_save_step(self.mode, self.mode_step)
        }

    def _collections_of(self, name: str) -> frozenset[Collection]:
        found = self._colls_of.get(name)
        if found is None:
            found = frozenset(c for c in self._included() if c.matches(name))
            self._colls_of[name] = found
        return found

    @property
    def _writing(self) -> bool:
        """Whether this worker writes at all (dry_run, include_workers)."""
        return not self.dry_run and (self.include_workers == "all" or self.worker == DEFAULT_WORKER)

    def is_due(self, name: str) -> bool:
        """Whether a tensor of this name would be saved at the current step (cheap, cached)."""
        return self._in_step and self._writing and not self._due.isdisjoint(self._collections_of(name))

    def has_due_collection(self, *names: str) -> bool:
        return self._in_step and self._writing and any(c.name in names for c in self._due)

    def add_to_collection(self, collection_name: str, tensor_name: str) -> None:
        self.get_collection(collection_name).add_tensor_name(tensor_name)

    # -- saving ------------------------------------------------------------------------------------
    def save_for_step(self, name: str, value: Any) -> bool:
        """Save a tensor seen by the framework if one of its collections is due now; True if saved."""
        if not self.is_due(name):
            return False
        colls = self._due.intersection(self._collections_of(name))
        self._write_for_tensor(name, value, colls)
        return True

    def _write_now(self, name: str, value: Any, colls: list[Collection] | None) -> None:
        if not self._prepared:
            self._prepare()
        if not self._writing:
            return
        opened = not self._in_step
        if opened:  # outside a step (before training or between steps) values go to the current step
            self.step = max(self.step, 0)
            self.mode_steps[self.mode] = max(self.mode_step, 0)
            self._in_step = True
        try:
            if colls is None:
                self._queue(name, self._to_numpy(value))
            else:
                self._write_for_tensor(name, value, colls)
        finally:
            if opened:
                self._in_step = False
                if self._writer is not None:
                    self._writer.end_step(self.step)

    def _write_for_tensor(self, name: str, value: Any, colls: Iterable[Collection]) -> None:
        colls = list(colls)
        try:
            done: set[tuple[str, bool]] = set()
            for coll in colls:
                if coll.name in SCALAR_COLLECTIONS:
                    continue
                for reduction, absolute in coll.reduction_config.reduction_pairs():
                    if (reduction, absolute) in done:
                        continue
                    done.add((reduction, absolute))
                    result = self._reduce(value, reduction, absolute)
                    # 0-d, in the reduction's dtype when the plugin gives a numpy scalar, as smdebug 1.0
                    result = np.asarray(result if isinstance(result, np.generic) else float(result))
                    self._queue(reduction_tensor_name(name, reduction, absolute), result)
            raw = any(c.reduction_config.save_raw_tensor for c in colls)
            shape = any(c.reduction_config.save_shape for c in colls)
            if raw or shape:
                array = self._to_numpy(value)
                if shape:
                    self._get_writer().write_shape(self.step, self.mode, self.mode_step, name, array.shape)
                if raw:
                    self._queue(name, array)
        except Exception as exc:  # never break training because of one tensor
            logger.warning(
                "smdebug: could not save %s at step %d: %s: %s", name, self.step, type(exc).__name__, exc
            )

    def _queue(self, name: str, array: np.ndarray) -> None:
        self._get_writer().write_tensor(self.step, self.mode, self.mode_step, name, array)
        self._saved_any = True
        plugins.hook().smdebug_tensor_saved(hook=self, name=name, value=array, step=self.step, mode=self.mode)

    def _get_writer(self) -> RunWriter:
        if self._writer is None:
            self._store = plugins.open_store(self.out_dir)
            self._writer = RunWriter(self._store, self.worker, self.max_queue_bytes)
            at_exit(_close_at_exit, weakref.ref(self), self._writer)  # flush before thread pools stop
        return self._writer

    def _export_collections(self) -> None:
        if self._writer is None or not self._writing:
            return
        import json

        num_workers = self._get_num_workers() if self.include_workers == "all" else 1
        self.collection_manager.meta["num_workers"] = num_workers
        data = json.dumps(self.collection_manager.to_json_dict()).encode()
        self._writer.write_file(collections_file_path(self.worker), data)
        self._collections_exported = True

    def _check_out_dir(self) -> None:
        """Refuse an out_dir that already holds a run (no silent mixing of two runs). The workers of one
        distributed run share it: files of other workers are fine, this worker's own are not."""
        if self.dry_run:
            return
        try:
            worker = self._get_worker_name()
        except Exception:  # a plugin not initialised yet: only a finished run can be recognised
            worker = None
        try:
            store = plugins.open_store(self.out_dir)
            found = existing_run(store, worker)
        except Exception as exc:  # an unreachable location is reported when writing, not here
            logger.debug("smdebug: could not check %s: %s", redact(self.out_dir), type(exc).__name__)
            return
        if found:
            raise OutDirExistsError(
                f"out_dir: {redact(self.out_dir)} already holds {found}; smdebug does not mix two runs in "
                "one directory: choose a new out_dir"
            )

    def __repr__(self):
        return (
            f"<{type(self).__name__} out_dir={self.out_dir!r} step={self.step} mode={self.mode.name} "
            f"include_collections={self.include_collections}>"
        )


def _close_at_exit(ref, writer: RunWriter) -> None:
    """Interpreter exit: close the hook (flush, collections, end marker), or at least its writer."""
    hook = ref()
    try:
        if hook is not None:
            hook.close()
        else:
            writer.close()
    except Exception as exc:  # never let saving break interpreter exit
        logger.warning("smdebug: could not close at exit: %s", writer.store.describe(exc))
