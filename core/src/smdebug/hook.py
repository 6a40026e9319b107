"""BaseHook: the framework-neutral part of every hook, and the whole of what a framework plugin uses.

It keeps the step and per-mode step counters, decides which collections and tensors are due at the
current step, computes reductions (through the reduction hooks, so a plugin reduces where the tensor
lives) and hands host arrays to the off-thread writer. A framework plugin subclasses it and only adapts
its framework, through the public members below (docs/writing-a-plugin.md shows a whole plugin).

Declared by a plugin (class attributes):
    framework                     the alias, e.g. "pytorch"
    options_class                 HookConfig, or a subclass adding the plugin's own options
    collection_class              the plugin's Collection subclass, if any
    builtin_collections           collections every hook has
    builtin_patterns              {collection: regex or regexes} of the framework's tensor names
    default_include_collections   collections always saved, whatever the configuration
    default_save_config           the SaveConfig used when the user gives none (None: every 500 steps)
    scalar_collections            collections saved raw, without reductions or histograms
    train_only_collections        collections skipped in EVAL and PREDICT
    tensor_types                  what ``save_numbered`` saves out of nested outputs
    reduction_names_keep_index    reductions of ``name:0`` keep the ``:0`` in their names (TF graphs)

Overridden by a plugin (all optional):
    setup()                       per-hook set-up, at the end of ``__init__`` (a plugin defines no __init__)
    worker_name(), num_workers()  the distributed job's worker name ("worker_<rank>") and size
    prepare_collections()         resolve framework objects given to collections into names or patterns
    copy_options(), copy_state()  what a pickled copy (a Dask worker's) is rebuilt from

Called by a plugin:
    begin_step(), end_step()      step boundaries; they never raise into training
    next_idle_step()              both at once, cheaply, between two steps that save nothing
    raise_if_stop_requested()     raises StopTraining once after a rule or the stop signal asked for it
    anything_due(), is_due(name), any_due(names), has_due_collection(*names), due_collections,
    collections_of(name), layer_wanted(layer)
    save_for_step(name, value)    save a tensor the framework shows if it is due (and list it in its
                                  collections); save_numbered(prefix, values) for numbered outputs,
                                  numbered_tensors(prefix, values) to name them and save them later,
                                  tensors_in(values) the tensors of such an output, unnamed
    together()                    a block whose tensors' reductions start in one plugin call at its end
    plan_for(name), save_computed(values, reductions)
                                  a tensor whose saved value or reductions the plugin computes itself (a
                                  sharded tensor's, combined across the workers: each takes part, writing
                                  or not); record_placement(name, placement) says where a saved shard lies
    record_unsaved_tensor(name, reason)
                                  a tensor that could not be captured (the run's tensor notes list it)
    guard(what), warn_once(...)   never break training: log once, go on
    collections_changed()         collections must be prepared again before the next step
    collections_version           changes whenever collections_of's answers may have: a key for what a
                                  plugin derives from them
    flush(), close()              the core writes the collections file and the end-of-job marker
    health                        with health=True, the flight recorder to feed (smdebug.health)
    mode, step, mode_step, in_step, closed, writing, worker, options, is_copy
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from smdebug import plugins
from smdebug.checkpoint_state import resume_numbering
from smdebug.collection import (
    INPUT_SUFFIX,
    OUTPUT_SUFFIX,
    SCALAR_COLLECTIONS,
    TRAIN_ONLY_COLLECTIONS,
    Collection,
    CollectionKeys,
    CollectionManager,
)
from smdebug.config import HookConfig, ReductionConfig, SaveConfig, edits
from smdebug.exceptions import ConfigError, SMDebugTypeError, StopTraining, did_you_mean
from smdebug.hook_helpers import NESTED, Guard, close_at_exit, leaves, options_signature
from smdebug.hook_output import HookOutput
from smdebug.layout import DEFAULT_WORKER, END_OF_JOB_FILE
from smdebug.modes import ModeKeys, to_mode
from smdebug.reductions import reduction_tensor_name
from smdebug.stop_signal import StopSignal
from smdebug.store import redact
from smdebug.writing import Writer
from smdebug.writing.bounded import at_exit, run_bounded
from smdebug.writing.settings import RESERVE_BYTES

logger = logging.getLogger("smdebug")

SCALAR_PREFIX = "scalar/"
_NOTHING: frozenset = frozenset()
_active_hook: BaseHook | None = None


def get_hook() -> BaseHook | None:
    """The hook most recently created in this process (auto-activated or user-made), if any."""
    return _active_hook


def set_hook(hook: BaseHook | None) -> None:
    """Make ``hook`` the one ``get_hook`` returns (None forgets it)."""
    global _active_hook
    if hook is not None and not isinstance(hook, BaseHook):
        raise SMDebugTypeError(f"set_hook expects a hook, got {type(hook).__name__}")
    _active_hook = hook


class BaseHook(HookOutput):
    framework: ClassVar[str] = ""
    options_class: ClassVar[type[HookConfig]] = HookConfig
    collection_class: ClassVar[type[Collection]] = Collection
    builtin_collections: ClassVar[tuple[str, ...]] = (
        CollectionKeys.ALL,
        CollectionKeys.DEFAULT,
        CollectionKeys.WEIGHTS,
        CollectionKeys.BIASES,
        CollectionKeys.GRADIENTS,
        CollectionKeys.LOSSES,
    )
    builtin_patterns: ClassVar[Mapping[str, str | Iterable[str]]] = {}
    default_include_collections: ClassVar[tuple[str, ...]] = ()
    default_save_config: ClassVar[SaveConfig | None] = None
    scalar_collections: ClassVar[frozenset[str]] = SCALAR_COLLECTIONS
    train_only_collections: ClassVar[frozenset[str]] = TRAIN_ONLY_COLLECTIONS
    tensor_types: ClassVar[tuple[type, ...]] = (object,)
    reduction_names_keep_index: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:  # help(Hook) and IDEs show the options, not *args, **kwargs
            cls.__signature__ = options_signature(cls.options_class)

    def __init__(self, *args, **kwargs):
        """Every option of ``options_class`` (HookConfig: out_dir, export_tensorboard, tensorboard_dir,
        dry_run, reduction_config, save_config, include_regex, include_collections, save_all,
        include_workers, then the plugin's own), positionally in that order or by name."""
        global _active_hook
        options = self.options_class.from_arguments(args, kwargs)
        self.options = options
        self.out_dir = options.out_dir.rstrip("/") if len(options.out_dir) > 1 else options.out_dir
        self.export_tensorboard = options.export_tensorboard
        self.tensorboard_dir = options.tensorboard_dir or (
            f"{self.out_dir}/tensorboard" if options.export_tensorboard else None
        )
        self.dry_run = options.dry_run
        self.save_all = options.save_all
        self.include_workers = options.include_workers
        self.max_queue_bytes = options.max_queue_bytes
        default_save = options.save_config if options.save_config is not None else self.default_save_config
        self.save_config = copy.deepcopy(default_save) if default_save is not None else SaveConfig()
        # Without a reduction config tensors are saved as they are.
        self.reduction_config = options.reduction_config or ReductionConfig(save_raw_tensor=True)
        self.include_regex = list(options.include_regex or [])
        include = [*(options.include_collections or []), *self.default_include_collections]
        self.include_collections = list(dict.fromkeys(include))
        self.is_copy: bool = getattr(self, "is_copy", False)  # set before __init__ for a pickled copy
        self.shipped = False  # pickled to other processes (Dask workers), which write their own files

        self._colls_of: dict[str, frozenset[Collection]] = {}
        self.collections_version = 0  # changes whenever what collections_of answers may have changed
        self._any_due: dict[int, tuple] = {}  # id(names) -> (names, due collections, any_due's answer)
        # name -> (its collections, the due collections, what to save): valid while both are these objects
        self._plans: dict[str, tuple] = {}
        self._prepared = False
        self._closed_at_exit = None
        self.collection_manager = CollectionManager()
        for name in self.builtin_collections:
            self.collection_manager.get(name, cls=self.collection_class)
        for name, patterns in self.builtin_patterns.items():
            self.get_collection(name).include(patterns)
        if self.include_regex:
            self.get_collection(CollectionKeys.DEFAULT).include(self.include_regex)
            self._include(CollectionKeys.DEFAULT)
        if self.save_all:
            self.get_collection(CollectionKeys.ALL).include(".*")
            self._include(CollectionKeys.ALL)
        for name, settings in options.collections.items():
            settings.apply_to(self.get_collection(name))

        self.mode = ModeKeys.GLOBAL
        self.step = -1  # the first begin_step makes it 0
        self.mode_steps: dict[ModeKeys, int] = {ModeKeys.GLOBAL: -1}
        self._in_step = False
        self._due: frozenset[Collection] = frozenset()
        # (edits, mode, first, end): nothing is due at the mode's steps first..end-1 while the save
        # configurations and collections stay as they were, so those steps skip _collections_due
        self._idle: tuple = ()
        self._saved_now = False  # save_scalar/save_tensor wrote into the current step
        self._numbered: dict[str, int] = {}  # save_numbered's next index per prefix, this step
        # reductions started this step, not yet on the host: the plugins' results and their names
        self._pending: list[Any] = []
        self._pending_names: list[list[str]] = []
        self._gathered: list | None = None  # inside together(): tensors whose reductions start at its end
        self._saved_any = False
        self._collections_exported = False
        self._writer: Writer | None = None
        self._closed = False
        self._warned: set[str] = set()
        # the run's tensor notes (layout.tensor_notes_path): shard placements, tensors not captured
        self._placements: dict[str, dict] = {}
        self._unsaved_tensors: dict[str, dict] = {}
        self._notes_changed = False
        self.worker = DEFAULT_WORKER
        self.last_saved_step: int | None = None
        # a restarted job's hook numbers its steps on from its checkpoint (smdebug.checkpoint_state)
        self.checkpoints = resume_numbering(self)
        # a worker's copy writes beside the others in the run its original checked; a restarted job's
        # hook writes on in the run its earlier job wrote, which resume_numbering() made ready
        if not (self.is_copy or (self.checkpoints is not None and self.checkpoints.continues_run)):
            self._check_out_dir()
        # why training should stop (a rule that fired, the run's stop signal), looked for at step ends
        self._stop_signal = StopSignal(self.out_dir, self.dry_run)
        self.health = None  # the flight recorder and its triggers (smdebug.health), with health=True
        if options.health and not self.is_copy:
            from smdebug.health import HealthMonitor

            self.health = HealthMonitor(self, options.health_steps, options.health_loss_factor)
        self.setup()
        _active_hook = self  # closed at interpreter exit once it writes (_get_writer)
        logger.info("smdebug: saving to %s", redact(self.out_dir))

    # -- what a framework plugin may override ------------------------------------------------------
    def setup(self) -> None:
        """Per-hook set-up of a plugin, called at the end of ``__init__``."""

    def worker_name(self) -> str:
        """This process's worker name in a distributed job (``worker_<rank>``)."""
        return DEFAULT_WORKER

    def num_workers(self) -> int:
        """How many workers the distributed job has."""
        return 1

    def prepare_collections(self) -> None:
        """Turn framework objects given to collections into tensor names or patterns (before a step)."""

    def copy_options(self) -> HookConfig:
        """The options a pickled copy is built from (drop what cannot travel to another process)."""
        return self.options

    def copy_state(self) -> dict[str, Any]:
        """Attributes a pickled copy gets besides its options (set after its ``__init__``)."""
        return {}

    # -- common hook API (reference: Common Hook API) ----------------------------------------------
    def get_collection(self, name: str, create: bool = True) -> Collection:
        coll = self.collection_manager.get(name, create=create, cls=self.collection_class)
        self._forget_matches()
        return coll

    def get_collections(self) -> dict[str, Collection]:
        return self.collection_manager.collections

    def add_collection(self, collection: Collection) -> None:
        if not isinstance(collection, Collection):
            raise SMDebugTypeError(f"add_collection expects a Collection, got {type(collection).__name__}")
        self.collection_manager.add(collection)
        self._forget_matches()

    def add_to_collection(self, collection_name: str, tensor_name: str) -> None:
        self.get_collection(collection_name).add_tensor_name(tensor_name)

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
        """Save a scalar at the current step, whatever the save configuration; ``timestamp`` (seconds
        since the epoch) is the event's wall time, now by default."""
        if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, (int, float))):
            raise SMDebugTypeError(f"save_scalar({name!r}): timestamp must be seconds since the epoch")
        array = np.asarray(self._to_numpy(value))
        if array.size != 1:
            raise SMDebugTypeError(f"save_scalar({name!r}): value has {array.size} elements, expected one")
        # a 0-d tensor stays 0-d, as in smdebug 1.0
        self._write_now(SCALAR_PREFIX + name, array, None, wall_time=timestamp)

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
    def from_config(cls, config: HookConfig, **kwargs):
        """A hook of this class from a HookConfig (its collection settings included), plus options."""
        return cls(**config.arguments(), collections=config.collections, **kwargs)

    # -- rules and stopping training (smdebug.rules.runner, smdebug.stop_signal) ----------------------
    def add_rule(self, rule, action: str | None = "stoptraining", **params):
        """Evaluate a rule at the end of every saved step: a built-in rule's name with its parameters
        (``hook.add_rule("loss_not_decreasing", num_steps="5")``), a Rule subclass, or a built rule.
        With action "stoptraining" (the default) training stops when it fires; None only logs."""
        from smdebug.rules.runner import runner_of

        return runner_of(self, self._stop_signal).add(rule, action, params)

    def should_stop(self) -> bool:
        """Whether a rule, or the run's stop signal, asked training to stop."""
        return self._stop_signal.stop is not None

    @property
    def stop_reason(self) -> StopTraining | None:
        """The StopTraining exception describing why training should stop, or None."""
        return self._stop_signal.stop

    @property
    def rule_results(self) -> list:
        """Every firing of the hook's rules so far (RuleResult: rule, step, reason)."""
        from smdebug.rules.runner import runner_of

        runner = runner_of(self)
        return list(runner.results) if runner is not None else []

    def raise_if_stop_requested(self) -> None:
        """Raise StopTraining, once, after a rule or the stop signal asked training to stop."""
        stop = self._stop_signal.pending()
        if stop is not None:
            raise stop

    # -- step boundaries (called by framework plugins; never raise into training) ------------------
    def begin_step(self, step: int | None = None, mode_step: int | None = None) -> None:
        """Start the next step, or the given global step (and mode step; both default to the next)."""
        if self._in_step:
            self.end_step()
        with self.guard("start a step"):
            if not self._prepared:
                self._prepare()
            if self.checkpoints is not None:
                self.checkpoints.step_boundary()
            self.step = self.step + 1 if step is None else step
            current = self.mode_steps.get(self.mode, -1)
            self.mode_steps[self.mode] = current + 1 if mode_step is None else mode_step
            if self.mode != ModeKeys.GLOBAL:
                self.mode_steps[ModeKeys.GLOBAL] = self.step
            self._in_step = True
            if self._numbered:
                self._numbered.clear()
            due = _NOTHING if self._idle_at(self.mode_steps[self.mode]) else self._collections_due()
            if due != self._due:  # the same set keeps the same object: save_for_step's plans stay valid
                self._due = due
            plugins.step_begin(self)

    def end_step(self) -> None:
        """End the step: its tensors are queued for writing, observers and the hook's rules run."""
        if not self._in_step:
            return
        self._in_step = False
        wrote = bool(self._due) or self._saved_now
        if wrote and self.writing:
            self.last_saved_step = self.step
        self._saved_now = False
        if self._pending:
            self._flush_reductions()
        with self.guard("end a step"):
            if self._writer is not None:
                self._writer.end_step(self.step)
                if self._saved_any and not self._collections_exported:
                    self._export_collections()
            if self._notes_changed:
                self._export_notes()
        plugins.step_end(self)
        self._stop_signal.check()
        if self.health is not None:  # after the rules: one that fired writes the recorder
            self.health.step_ended(wrote)

    def next_idle_step(self) -> bool:
        """End this step and begin the next, touching as little as possible, when neither saves anything
        (most steps of a sparse configuration); step-end observers run as in end_step (not the core's rule
        runner: it has no new step to judge), and the stop signal is looked for. False when this
        is not such a step, or when a stop was requested at its end: the plugin then calls end_step()
        (nothing happens if the step has ended) and begin_step() itself. It does not call a plugin's
        overrides of those two: call it only when they would have nothing to do."""
        mode, steps = self.mode, self.mode_steps
        following = steps[mode] + 1
        if not (
            self._in_step
            and self._prepared
            and not (self._due or self._saved_now)
            and self._idle_at(following)
            and not (self.health is not None and self.health.pending)
        ):
            return False
        self._in_step = False
        if plugins.listens_to_idle_steps(self):
            plugins.step_end(self)
        stopping = self._stop_signal
        stopping.check()
        if stopping.stop is not None and not stopping.raised:
            return False
        if self.checkpoints is not None:
            self.checkpoints.step_boundary()
        self.step += 1
        steps[mode] = following
        if mode is not ModeKeys.GLOBAL:
            steps[ModeKeys.GLOBAL] = self.step
        if self._numbered:
            self._numbered.clear()
        self._in_step = True
        plugins.step_begin(self)
        return True

    @property
    def mode_step(self) -> int:
        return self.mode_steps.get(self.mode, -1)

    @property
    def in_step(self) -> bool:
        return self._in_step

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def writing(self) -> bool:
        """Whether this worker writes at all (dry_run, include_workers)."""
        return not self.dry_run and (self.include_workers == "all" or self.worker == DEFAULT_WORKER)

    # -- never break training ----------------------------------------------------------------------
    def guard(self, what: str) -> Guard:
        """A context manager for a block that must not break training: an exception in it is logged once
        per ``what`` ("could not <what> at step N: ...") and swallowed. StopTraining passes through."""
        return Guard(self, what)

    def warn_once(self, key: str, message: str, *args) -> None:
        """Log a warning the first time ``key`` is seen by this hook."""
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    # -- deciding what to save ---------------------------------------------------------------------
    def anything_due(self) -> bool:
        """Whether any collection is due at this step (False outside a step): the cheap first test."""
        return self._in_step and bool(self._due) and self.writing

    def is_due(self, name: str) -> bool:
        """Whether a tensor of this name would be saved at the current step (cheap, cached)."""
        return self.anything_due() and not self._due.isdisjoint(self.collections_of(name))

    def any_due(self, names: Sequence[str]) -> bool:
        """Whether a tensor of any of these names would be saved at this step. Cached for the same
        sequence object (a model's parameter names, asked at every step) while the due collections and
        the collections stay the same."""
        if not self.anything_due():
            return False
        due = self._due
        known = self._any_due.get(id(names))
        if known is None or known[0] is not names or known[1] is not due:
            found = any(not due.isdisjoint(self.collections_of(name)) for name in names)
            known = self._any_due[id(names)] = (names, due, found)  # holding names keeps its id unique
        return known[2]

    def has_due_collection(self, *names: str) -> bool:
        return self.anything_due() and any(c.name in names for c in self._due)

    @property
    def due_collections(self) -> frozenset[Collection]:
        """The collections due at this step (empty outside a step)."""
        return self._due if self._in_step else frozenset()

    def collections_of(self, name: str) -> frozenset[Collection]:
        """The included collections a tensor of this name belongs to (cached)."""
        found = self._colls_of.get(name)
        if found is None:
            found = frozenset(c for c in self._included() if c.matches(name))
            self._colls_of[name] = found
        return found

    def layer_wanted(self, layer: str) -> bool:
        """Whether an included collection may hold a layer's inputs or outputs, asked with the names of
        its first call in a step (``<layer>_input_0``, ``<layer>_output_0``): the layers worth a callback."""
        return bool(
            self.collections_of(f"{layer}{INPUT_SUFFIX}0") or self.collections_of(f"{layer}{OUTPUT_SUFFIX}0")
        )

    def collections_changed(self) -> None:
        """Collections (or what ``prepare_collections`` resolves) changed: prepare them again."""
        self._prepared = False
        self._forget_matches()

    def _forget_matches(self) -> None:
        self._colls_of.clear()
        self._any_due.clear()
        self._idle = ()
        self.collections_version += 1

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
        if self._closed_at_exit is None:  # training started: the run is finished at exit at the latest
            self._closed_at_exit = weakref.ref(self)
            at_exit(close_at_exit, self._closed_at_exit, None)
        self.worker = self.worker_name()
        self.prepare_collections()
        for name in self.include_collections:
            self.collection_manager.get(name, cls=self.collection_class)
        for coll in self.collection_manager.collections.values():
            coll.save_config.merge_default_save_config(self.save_config)
            if coll.name in self.scalar_collections:
                coll.reduction_config = ReductionConfig(save_raw_tensor=True)
                coll.save_histogram = False
            elif coll.reduction_config is None:
                coll.reduction_config = self.reduction_config
        for coll in self._included():
            if coll.name not in self.builtin_collections and not (coll.include_regex or coll.tensor_names):
                known = [
                    *self.builtin_collections,
                    *self.builtin_patterns,
                    *self.collection_manager.collections,
                ]
                self.warn_once(
                    f"empty:{coll.name}",
                    "smdebug: collection %r has no include_regex or tensor names: it saves nothing%s",
                    coll.name,
                    did_you_mean(coll.name, [n for n in known if n != coll.name]),
                )
        self._forget_matches()
        self._prepared = True

    def _collections_due(self) -> frozenset[Collection]:
        mode, step = self.mode, self.mode_step
        skipped = self.train_only_collections if mode in (ModeKeys.EVAL, ModeKeys.PREDICT) else ()
        configs = [
            (c, c.save_config.get_save_config(mode)) for c in self._included() if c.name not in skipped
        ]
        due = frozenset(c for c, cfg in configs if cfg.should_save_step(step))
        if not due:
            later = [n for n in (cfg.next_save_step(step + 1) for _, cfg in configs) if n is not None]
            end = min(later, default=float("inf"))
            self._idle = (edits[0], mode, step, end)
        return due

    def _idle_at(self, mode_step: int) -> bool:
        """Whether this mode step is one of the idle steps _collections_due found last, nothing changed."""
        idle = self._idle
        return bool(idle) and idle[0] == edits[0] and idle[1] is self.mode and idle[2] <= mode_step < idle[3]

    # -- saving ------------------------------------------------------------------------------------
    def save_for_step(self, name: str, value: Any) -> bool:
        """Save a tensor seen by the framework if one of its collections is due now; True if saved.
        The name is recorded in its collections, so the run's collections file lists it."""
        if not (self._in_step and self._due and self.writing):
            return False
        plan = self._due_plan(name, value)
        if plan is None:
            return False
        pairs, names, raw, shape = plan
        if self._gathered is not None and pairs and not (raw or shape):  # reductions only, in a together()
            self._gathered.append((name, value, pairs, names))  # block: what _reduce_all does, inline
        else:
            self._write_planned(name, value, plan)
        return True

    def _due_plan(self, name: str, value: Any) -> tuple | None:
        """The plan of a tensor due at this step (cached, see _plan), None when it is not due; a due
        tensor's name is recorded in its collections."""
        colls = self._colls_of.get(name)
        if colls is None:
            colls = self.collections_of(name)
        due = self._due
        plan = self._plans.get(name)
        if plan is None or plan[0] is not colls or plan[1] is not due:
            if due.isdisjoint(colls):
                return None
            plan = self._plans[name] = (colls, due, self._plan(name, value, due.intersection(colls)))
            for coll in colls:
                coll.add_tensor_name(name)
        return plan[2]

    # -- tensors a plugin computes itself (a sharded tensor: its workers compute it together) ------
    def plan_for(self, name: str) -> tuple[tuple[tuple[str, bool], ...], bool] | None:
        """(reduction pairs, whether the value is saved) of a numeric tensor of this name due at this
        step, None when it is not due: asked on every worker, writing or not (include_workers), for the
        workers of a sharded tensor combine its reductions together and each must take part."""
        if not (self._in_step and self._due):
            return None
        plan = self._due_plan(name, None)
        return None if plan is None else (plan[0], plan[2] or plan[3])

    def save_computed(
        self,
        values: Mapping[str, Any] | None = None,
        reductions: Mapping[str, Mapping[tuple[str, bool], np.generic]] | None = None,
    ) -> None:
        """Save what the plugin computed itself for tensors due now (plan_for): values by tensor name,
        and reductions by tensor name, ``{(reduction, abs): numpy scalar}`` (written together). Nothing on
        a worker that does not write."""
        if not (self._in_step and self.writing):
            return
        for name, value in (values or {}).items():
            self._write_planned(name, value, ((), [], True, False))
        names, rows = [], []
        for name, results in (reductions or {}).items():
            if results:
                names.append([reduction_tensor_name(name, r, a) for r, a in results])
                rows.append(np.array(list(results.values())))
        if rows:
            with self.guard("save reductions"):
                self._write_reductions(names, rows)

    def record_placement(self, name: str, placement: Mapping[str, Any]) -> None:
        """Record where this worker's saved value of ``name`` lies in the full tensor it is a shard of
        (global_shape, offsets, local_shape, mesh_shape, coordinate, placements): the Trial assembles
        the full tensor from the workers' shards."""
        placement = dict(placement)
        if self._placements.get(name) != placement:
            self._placements[name] = placement
            self._notes_changed = True

    def record_unsaved_tensor(self, name: str, reason: str) -> None:
        """Record in the run that a tensor could not be captured (the first step it failed, and why)."""
        if name not in self._unsaved_tensors:
            self._unsaved_tensors[name] = {"step": self.step, "reason": reason}
            self._notes_changed = True

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """The reductions of the tensors saved within the block are started together at its end, in one
        ``smdebug_reductions`` call (the framework reduces them in a few kernels, not one per tensor). For
        tensors that cannot change before the block ends (a model's parameters in a loop over them)."""
        if self._gathered is not None:  # nested: the outer block starts them
            yield
            return
        self._gathered = []
        try:
            yield
        finally:
            gathered, self._gathered = self._gathered, None
            if gathered:
                self._start_reductions(gathered)

    def numbered_tensors(self, prefix: str, values: Any) -> list[tuple[str, Any]]:
        """``(<prefix><i>, tensor)`` of each tensor of a (nested) tuple, list or dict, numbered on from the
        step's earlier calls with this prefix (``dense_output_0``, ``dense_output_1``...): the numbers
        are taken, for a plugin that saves them later."""
        index = self._numbered.get(prefix, 0)
        if type(values) is tuple and len(values) == 1:  # a layer's inputs, most often
            values = values[0]
        if values is not None and not isinstance(values, NESTED) and isinstance(values, self.tensor_types):
            named = [(f"{prefix}{index}", values)]  # one tensor: no walk
        else:
            named = [(f"{prefix}{i}", v) for i, v in enumerate(leaves(values, self.tensor_types), index)]
        self._numbered[prefix] = index + len(named)
        return named

    def tensors_in(self, values: Any) -> Iterator[Any]:
        """The tensors (``tensor_types``) of a (nested) tuple, list or dict, in order, or the value itself:
        what numbered_tensors names, without taking numbers."""
        return leaves(values, self.tensor_types)

    def save_numbered(self, prefix: str, values: Any) -> None:
        """Save each tensor of a (nested) tuple, list or dict as ``<prefix><i>`` (see numbered_tensors)."""
        for name, value in self.numbered_tensors(prefix, values):
            self.save_for_step(name, value)

    def flush(self) -> None:
        """Make everything saved so far readable (collections file included); the run stays open."""
        if self._in_step:
            self.end_step()
        if self._writer is not None:
            with self.guard("flush"):
                self._export_collections()
                self._writer.flush()

    def close(self) -> None:
        """End the current step, write everything still queued and mark the run as finished (a
        pickled worker's copy leaves the end-of-job marker to its original)."""
        if self._closed:
            return
        self._closed = True
        if self._in_step:
            self.end_step()
        if self.health is not None:
            self.health.close()
        if self.checkpoints is not None:
            self.checkpoints.close()
        with self.guard("close"):
            if self._writer is None and self._closed_at_exit and self.writing and not self.shipped:
                self._get_writer()  # nothing was saved: the run (collections, end marker) exists all the same
            if self._writer is not None:
                self._export_collections()
                # the end-of-job marker comes last, after the record of any step that could not be saved
                self._writer.close(end_of_job=not self.is_copy)
                unsaved = self._writer.unsaved_report()
                if unsaved:
                    logger.warning("smdebug: saving to %s is incomplete: %s", self._writer.uri, unsaved)
            elif self.shipped and not self.is_copy and not self.dry_run:
                # only the workers' copies wrote: the run they wrote is finished (within the close timeout)
                run_bounded(lambda: plugins.open_store(self.out_dir).write_bytes(END_OF_JOB_FILE, b""))
            if self._writer is None and getattr(self, "_out_dir_check", None) is not None:
                self._out_dir_check.release_if_unused()  # never wrote: leave nothing behind
        plugins.hook_closed(self)

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

    def _write_now(self, name: str, value: Any, colls: list[Collection] | None, wall_time=None) -> None:
        if not self._prepared:
            self._prepare()
        if not self.writing:
            return
        opened = not self._in_step
        self._saved_now = not opened
        if opened:  # outside a step (before training or between steps) values go to the current step
            if self.checkpoints is not None and self.step == self.checkpoints.resumed_from:
                self.step += 1  # a restarted job's first (its checkpoint's step is the earlier job's)
                self.mode_steps[self.mode] = self.mode_step + 1
            self.step = max(self.step, 0)
            self.mode_steps[self.mode] = max(self.mode_step, 0)
            self._in_step = True
        try:
            if colls is None:
                self._queue(name, self._to_numpy(value), wall_time)
            else:
                self._write_for_tensor(name, value, colls)
        finally:
            if opened:
                self._flush_reductions()
                self._in_step = False
                if self._writer is not None:
                    self._writer.end_step(self.step)

    def _plan(self, name: str, value: Any, colls: Iterable[Collection]) -> tuple:
        """What saving a tensor means for these collections: (reduction pairs, their tensor names, raw,
        shape); a text tensor is saved raw only. Cached per tensor name while its collections and the
        due collections stay the same objects (save_for_step)."""
        colls = list(colls)
        numeric = not (isinstance(value, np.ndarray) and value.dtype.kind in "USO")  # text: raw only
        pairs = tuple(
            {
                pair: None
                for c in colls
                if numeric and c.name not in self.scalar_collections
                for pair in c.reduction_config.reduction_pairs()
            }
        )
        names = [reduction_tensor_name(name, r, a, self.reduction_names_keep_index) for r, a in pairs]
        raw = not numeric or any(c.reduction_config.save_raw_tensor for c in colls)
        shape = any(c.reduction_config.save_shape for c in colls)
        return pairs, names, raw, shape

    def _write_for_tensor(self, name: str, value: Any, colls: Iterable[Collection]) -> None:
        self._write_planned(name, value, self._plan(name, value, colls))

    def _write_planned(self, name: str, value: Any, plan: tuple) -> None:
        pairs, names, raw, shape = plan
        try:
            if pairs:
                self._reduce_all(name, value, pairs, names)
            if raw or shape:
                writer = self._writer or self._get_writer()
                if raw and not shape and not plugins.listens_to_tensors(self):
                    view = plugins.host_view(value)  # the writer copies it at once: no copy of our own
                    if type(view) is np.ndarray:  # (anything else: a copy from to_numpy)
                        writer.write_view(self.step, self.mode, self.mode_step, name, view)
                        self._saved_any = True  # (nothing observes saved tensors: checked above)
                        return
                reserved = 0
                if raw and not shape and not isinstance(value, np.ndarray):
                    # the copy for the writer is made only once the queue has room for it
                    try:
                        nbytes = getattr(value, "nbytes", None)
                    except Exception:  # a sparse torch tensor has no storage to measure
                        nbytes = None
                    if isinstance(nbytes, int) and nbytes >= RESERVE_BYTES:
                        writer.reserve(nbytes)
                        reserved = nbytes
                try:
                    array = self._to_numpy(value)
                except BaseException:
                    if reserved:
                        writer.reserve(-reserved)
                    raise
                if shape:
                    writer.write_shape(self.step, self.mode, self.mode_step, name, array.shape)
                if raw:
                    self._queue(name, array, reserved=reserved)
        except Exception as exc:  # never break training because of one tensor
            self._not_captured(name, "save", exc)

    def _not_captured(self, name: str, what: str, exc: Exception) -> None:
        """Warn once per tensor (not at every step) and record it in the run's tensor notes."""
        reason = f"{type(exc).__name__}: {exc}"
        self.warn_once(
            f"{what}:{name}",
            "smdebug: could not %s %s at step %d (recorded in the run, not warned again): %s",
            what,
            name,
            self.step,
            reason,
        )
        self.record_unsaved_tensor(name, f"could not {what}: {reason}")

    def _reduce_all(
        self, name: str, value: Any, pairs: tuple[tuple[str, bool], ...], names: list[str] | None = None
    ) -> None:
        """A tensor's reductions: started where it lives (with the others of a ``together`` block) and
        brought to the host with the rest of the step's at its end (one transfer per step)."""
        if names is None:
            names = [reduction_tensor_name(name, r, a, self.reduction_names_keep_index) for r, a in pairs]
        if self._gathered is not None:
            self._gathered.append((name, value, pairs, names))
        else:
            self._start_reductions([(name, value, pairs, names)])

    def _start_reductions(self, items: list[tuple]) -> None:
        """One smdebug_reductions call per set of requested reductions; what no plugin reduces where it
        lives is reduced one by one (numpy's fallback)."""
        groups: dict[tuple, list[tuple]] = {}
        for item in items:
            groups.setdefault(item[2], []).append(item)
        for pairs, members in groups.items():
            started = plugins.reductions([m[1] for m in members], list(pairs))
            if started is not None and not any(r is None for r in started):  # the common case, in bulk
                self._pending.extend(started)
                self._pending_names.extend([m[3] for m in members])
                continue
            for i, (name, value, _, names) in enumerate(members):
                result = started[i] if started is not None else None
                if result is not None:
                    self._pending.append(result)
                    self._pending_names.append(names)
                    continue
                try:
                    self._reduce_one_by_one(name, value, pairs)
                except Exception as exc:  # never break training because of one tensor
                    self._not_captured(name, "reduce", exc)

    def _reduce_one_by_one(self, name: str, value: Any, pairs: tuple[tuple[str, bool], ...]) -> None:
        for reduction, absolute in pairs:
            try:
                result = self._reduce(value, reduction, absolute)
            except ValueError as exc:  # undefined for this value (empty): the raw tensor still goes
                self.warn_once(f"reduce:{name}", "smdebug: no reductions of %s: %s", name, exc)
                return
            # 0-d, in the reduction's dtype when the plugin gives a numpy scalar, as smdebug 1.0
            result = np.asarray(result if isinstance(result, np.generic) else float(result))
            self._queue(
                reduction_tensor_name(name, reduction, absolute, self.reduction_names_keep_index), result
            )

    def _flush_reductions(self) -> None:
        """Queue the step's pending reductions, brought to the host together."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        names, self._pending_names = self._pending_names, []
        with self.guard("save reductions"):
            self._write_reductions(names, plugins.to_host(pending))

    def _write_reductions(self, names: list[list[str]], rows) -> None:
        """Queue reductions: ``rows[i]`` (a 1-d host array) holds the 0-d values named ``names[i]``."""
        writer = self._writer or self._get_writer()
        writer.write_scalars(self.step, self.mode, self.mode_step, names, rows, time.time())
        if plugins.listens_to_tensors(self):
            for some, results in zip(names, rows):
                for name, result in zip(some, results):
                    plugins.tensor_saved(self, name, np.asarray(result))
        self._saved_any = True

    def _queue(self, name: str, array: np.ndarray, wall_time: float | None = None, reserved: int = 0) -> None:
        writer = self._writer or self._get_writer()
        writer.write_tensor(self.step, self.mode, self.mode_step, name, array, wall_time, reserved)
        self._saved_any = True
        plugins.tensor_saved(self, name, array)

    # -- copies ------------------------------------------------------------------------------------
    def __reduce__(self):
        """Pickled (Dask ships a training callback to its workers): rebuilt on the other side from the
        options, as a worker's copy that writes its own files into the same run."""
        self.shipped = True
        return (_rebuild_copy, (type(self), self.copy_options(), self.collection_manager, self.copy_state()))

    def __repr__(self):
        return (
            f"<{type(self).__name__} out_dir={self.out_dir!r} step={self.step} mode={self.mode.name} "
            f"include_collections={self.include_collections}>"
        )


def _rebuild_copy(cls: type[BaseHook], options: HookConfig, collection_manager, state: dict) -> BaseHook:
    hook = cls.__new__(cls)
    hook.is_copy = True
    hook.__init__(**options.arguments(), collections=options.collections)
    hook.collection_manager = collection_manager
    hook.collections_changed()
    for name, value in state.items():
        setattr(hook, name, value)
    return hook


BaseHook.__signature__ = options_signature(HookConfig)
