"""BaseHook: the framework-neutral part of every hook, and the whole of what a framework plugin uses.

It keeps the step and per-mode step counters, decides which collections and tensors are due at the
current step (smdebug.hook_due), captures them (smdebug.hook_capture), computes reductions through the
reduction hooks, so a plugin reduces where the tensor lives (smdebug.hook_reducing), and hands host
arrays to the off-thread writer (smdebug.hook_output). A framework plugin subclasses it and only adapts
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
    stops_together                the plugin makes its workers stop after the same step itself (else the
                                  workers of a distributed run agree on it through the run: stop_signal)
    reduction_names_keep_index    reductions of ``name:0`` keep the ``:0`` in their names (TF graphs)
    host_view_of                  a numpy view of a plain tensor of the framework's, else None: called per
                                  tensor saved raw in place of the smdebug_host_view plugin call, which
                                  answers the same (None: the plugin call)

Overridden by a plugin (all optional):
    setup()                       per-hook set-up, at the end of ``__init__`` (a plugin defines no __init__)
    worker_name(), num_workers()  the distributed job's worker name ("worker_<rank>") and size
    prepare_collections()         resolve framework objects given to collections into names or patterns
    copy_options(), copy_state()  what a pickled copy (a Dask worker's) is rebuilt from

Called by a plugin:
    begin_step(), end_step()      step boundaries; they never raise into training
    next_idle_step()              both at once, cheaply, between two steps that save nothing
    raise_if_stop_requested()     raises StopTraining once after a rule or the stop signal asked for it;
                                  should_stop() asks the same without raising
    anything_due(), is_due(name), any_due(names), has_due_collection(*names), due_collections,
    collections_of(name), layer_wanted(layer)
    save_for_step(name, value)    save a tensor the framework shows if it is due (and list it in its
                                  collections); save_many_for_step(names, values) for a list of them
                                  saved at every step (a model's parameters), planned once for the
                                  same names tuple; save_numbered(prefix, values) for numbered outputs,
                                  numbered_tensors(prefix, values) to name them and save them later,
                                  tensors_in(values) the tensors of such an output, unnamed
    together()                    a block whose tensors' reductions start in one plugin call at its end
    plan_for(name), save_computed(values, reductions)
                                  a tensor whose saved value or reductions the plugin computes itself (a
                                  sharded tensor's, combined across the workers: each takes part, writing
                                  or not); record_placement(name, placement) says where a saved shard lies
    record_unsaved_tensor(name, reason)
                                  a tensor that could not be captured (the run's tensor notes list it)
    write_summary(serialized)     a TensorBoard Summary the framework serialized, to the hook's TensorBoard run
    guard(what), warn_once(...)   never break training: log once, go on
    collections_changed()         collections must be prepared again before the next step
    collections_version           changes whenever collections_of's answers may have: a key for what a
                                  plugin derives from them
    flush(), close()              the core writes the collections file and the end-of-job marker
    health                        with health=True, the flight recorder to feed (smdebug.health)
    mode, step, mode_step, in_step, closed, writing, worker, options, is_copy
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from smdebug import plugins
from smdebug.checkpoint_state import resume_numbering
from smdebug.collection import (
    SCALAR_COLLECTIONS,
    TRAIN_ONLY_COLLECTIONS,
    Collection,
    CollectionKeys,
    CollectionManager,
)
from smdebug.config import HookConfig, ReductionConfig, SaveConfig
from smdebug.exceptions import ConfigError, SMDebugTypeError, StopTraining
from smdebug.hook_capture import HookCapture
from smdebug.hook_due import DuePlanning
from smdebug.hook_helpers import Guard, options_signature
from smdebug.hook_output import HookOutput
from smdebug.hook_reducing import HookReducing
from smdebug.layout import DEFAULT_WORKER, END_OF_JOB_FILE
from smdebug.modes import ModeKeys, to_mode
from smdebug.stop_signal import StopSignal
from smdebug.store import Store, redact, strip_trailing_slashes
from smdebug.writing import Writer
from smdebug.writing.bounded import run_bounded

logger = logging.getLogger("smdebug")

SCALAR_PREFIX = "scalar/"
_NOTHING: frozenset = frozenset()
_active_hook: BaseHook | None = None


def get_hook() -> BaseHook | None:
    """The hook most recently created in this process (auto-activated or user-made), if any."""
    return _active_hook


def _activated_from(cls: type[BaseHook], path: str) -> BaseHook | None:
    """The open hook that activation on the import of ``cls``'s framework built from this configuration
    file, as ``cls`` (``cls.activated_as``), if any: a second hook of that file would find its out_dir taken."""
    from smdebug.activation import activated

    real = os.path.realpath(path)
    for hook in activated().values():
        if hook.framework == cls.framework and not hook.closed and hook.config_path == real:
            return cls.activated_as(hook)
    return None


def _free_out_dir(out_dir: str) -> None:
    """A script's own hook takes over the out_dir of a hook activated on import that has written nothing
    (SageMaker's LocalPath as the script's out_dir): that hook's claim on the folder goes."""
    from smdebug.activation import activated

    for hook in activated().values():
        check = getattr(hook, "_out_dir_check", None)
        if check is not None and hook._writer is None and Store.place(hook.out_dir) == Store.place(out_dir):
            check.release_if_unused()


def set_hook(hook: BaseHook | None) -> None:
    """Make ``hook`` the one ``get_hook`` returns (None forgets it)."""
    global _active_hook
    if hook is not None and not isinstance(hook, BaseHook):
        raise SMDebugTypeError(f"set_hook expects a hook, got {type(hook).__name__}")
    _active_hook = hook


class BaseHook(HookCapture, HookReducing, DuePlanning, HookOutput):
    __doc__ = __doc__  # the plugin API the module's docstring lists, for help(BaseHook)

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
    stops_together: ClassVar[bool] = False
    reduction_names_keep_index: ClassVar[bool] = False
    host_view_of: ClassVar[Callable[[Any], np.ndarray | None] | None] = None

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
        self.out_dir = strip_trailing_slashes(options.out_dir)
        self.export_tensorboard = options.export_tensorboard
        self.tensorboard_dir = options.tensorboard_dir or (
            f"{self.out_dir}/tensorboard" if options.export_tensorboard else None
        )
        self.dry_run = options.dry_run
        self.save_all = options.save_all
        self.include_workers = options.include_workers
        self.max_queue_bytes = options.max_queue_bytes
        self.config_path: str | None = None  # the JSON configuration file it was built from, if any
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
        for coll in self.collection_manager.collections.values():
            coll.save_config.merge_default_save_config(self.save_config)

        self.mode = ModeKeys.GLOBAL
        self.step = -1  # the first begin_step makes it 0
        self.mode_steps: dict[ModeKeys, int] = {ModeKeys.GLOBAL: -1}
        self._in_step = False
        self._due: frozenset[Collection] = frozenset()
        # (edits, mode, first, end, due): the collections due at the mode's steps first..end-1 while the
        # save configurations and collections stay as they were (those steps skip asking them again)
        self._span: tuple = ()
        self._saved_now = False  # save_scalar/save_tensor wrote into the current step
        self._step_mode: ModeKeys | None = None  # the mode of the last step begun (None before the first)
        self._early: list[tuple] = []  # what save_scalar/save_tensor gave before the first step: for it
        self._numbered: dict[str, int] = {}  # save_numbered's next index per prefix, this step
        # reductions started this step, not yet on the host: the plugins' results and their names
        self._pending: list[Any] = []
        self._pending_names: list[list[list[str]]] = []  # per block: each result's reduction names
        self._joined_names: tuple[list, list] = ([], [])  # the last step's blocks, and their names joined
        # (step, the reductions' names it wrote): the health recorder does not write them again
        self._reduced: tuple[int, list[list[str]]] = (-1, [])
        self._bulk_plans: dict[int, tuple] = {}  # id(names) -> save_many_for_step's plan (hook_capture)
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
            _free_out_dir(self.out_dir)
            self._check_out_dir()
        # why training should stop (a rule that fired, the run's stop signal), looked for at step ends
        self._stop_signal = StopSignal(self.out_dir, self.dry_run, self)
        self.health = None  # the flight recorder and its triggers (smdebug.health), with health=True
        if options.health and not self.is_copy:
            from smdebug.health import HealthMonitor

            self.health = HealthMonitor(self, options.health_steps, options.health_loss_factor)
        try:
            self.setup()
        except BaseException:
            # a plugin refused its arguments: the out_dir stays free for the corrected hook
            if getattr(self, "_out_dir_check", None) is not None:
                self._out_dir_check.release_if_unused()
            raise
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

    @classmethod
    def activated_as(cls, hook: BaseHook) -> BaseHook | None:
        """The hook activated on import, given to a script's ``create_from_json_file`` of the same file
        as this class; None when it is not one (a plugin whose activation makes a more general class
        turns it into this one here)."""
        return hook if isinstance(hook, cls) else None

    def copy_options(self) -> HookConfig:
        """The options a pickled copy is built from (drop what cannot travel to another process)."""
        return self.options

    def copy_state(self) -> dict[str, Any]:
        """Attributes a pickled copy gets besides its options (set after its ``__init__``)."""
        return {}

    # -- common hook API (reference: Common Hook API) ----------------------------------------------
    def get_collection(self, name: str, create: bool = True) -> Collection:
        new = name not in self.collection_manager.collections
        coll = self.collection_manager.get(name, create=create, cls=self.collection_class)
        if new and coll is not None:  # the reference: a new collection uses the hook's save configuration
            coll.save_config.merge_default_save_config(self.save_config)
        self._forget_matches()
        return coll

    def get_collections(self) -> dict[str, Collection]:
        return self.collection_manager.collections

    def add_collection(self, collection: Collection) -> None:
        if not isinstance(collection, Collection):
            raise SMDebugTypeError(f"add_collection expects a Collection, got {type(collection).__name__}")
        collection.save_config.merge_default_save_config(self.save_config)  # for the modes it leaves unset
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
        array = np.asarray(self._to_numpy(_user_scalar(value)))
        if array.size != 1:
            raise SMDebugTypeError(f"save_scalar({name!r}): value has {array.size} elements, expected one")
        # a 0-d tensor stays 0-d, as in smdebug 1.0
        self._write_now(SCALAR_PREFIX + name, array, None, wall_time=timestamp)

    def save_tensor(self, tensor_name: str, tensor_value, collections_to_write="default") -> None:
        """Save a tensor at the current step into the given collections, whatever their save config."""
        colls = self.save_tensor_collections(tensor_name, collections_to_write)
        self._write_now(tensor_name, _user_scalar(tensor_value), colls)

    def save_tensor_collections(self, tensor_name: str, collections_to_write="default") -> list[Collection]:
        """The collections ``save_tensor`` saves a tensor into (a name or a list of names), the tensor
        recorded in each and each included (for a plugin saving such a tensor its own way)."""
        names = (
            [collections_to_write] if isinstance(collections_to_write, str) else list(collections_to_write)
        )
        colls = []
        for cname in names:
            coll = self.get_collection(cname)
            coll.add_tensor_name(tensor_name)
            self._include(cname)
            colls.append(coll)
        return colls

    def write_summary(self, summary: bytes) -> bool:
        """A serialized TensorBoard Summary (a framework's own summary op computed it) for the current step,
        written to the hook's TensorBoard run as it is; False when the hook exports none (neither
        export_tensorboard nor tensorboard_dir)."""
        if self.tensorboard_dir is None or self.dry_run:
            return False
        from smdebug import tensorboard

        return tensorboard.summary_given(self, summary, self.step, self.mode)

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None):
        """Build a hook from the SageMaker JSON configuration (None when there is none)."""
        from smdebug.json_config import find_config_path, load_hook_config

        path = find_config_path(json_file_path)
        if path is None:
            logger.info("smdebug: no hook configuration found, no hook created")
            return None
        activated = _activated_from(cls, path)
        if activated is not None:  # the script asks for the hook its import already made of this file
            return activated
        # as smdebug 1.0, save keys the file leaves out are the hook's default's (XGBoost: every 10 steps)
        default = cls.default_save_config
        defaults = default.get_save_config(ModeKeys.GLOBAL).to_json_dict() if default else None
        hook = cls.from_config(load_hook_config(path, save_defaults=defaults))
        hook.config_path = os.path.realpath(path)
        return hook

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
            self._step_mode = self.mode
            plugins.step_begin(self)
            if self._early:
                early, self._early = self._early, []
                for item in early:
                    self._write_now(*item)

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
        if self.health is not None:
            self.health.save_row()
        with self.guard("end a step"):
            if self._notes_changed:  # before the step's index: a live reader of it finds its placements
                self._export_notes()
            if self._writer is not None:
                if self._saved_any and not self._collections_exported:
                    # before the first step's index: a live reader knows how many workers write the run
                    self._export_collections()
                self._writer.end_step(self.step)
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
        if self._early:  # saved, and no step began: they make one
            early, self._early = self._early, []
            self._write_outside_step(early)
        if self.health is not None:
            self.health.close()
        if self.checkpoints is not None:
            self.checkpoints.close()
        with self.guard("close"):
            # nothing was saved: the run (collections, end marker) exists all the same, also when a restarted
            # job that took the run over had no step left to train
            took_over = self.checkpoints is not None and self.checkpoints.continues_run
            if (
                self._writer is None
                and (self._closed_at_exit or took_over)
                and self.writing
                and not self.shipped
            ):
                self._get_writer()
            if self._writer is not None:
                self._export_collections()
                # the end-of-job marker comes last, after the record of any step that could not be saved
                # (of a run several workers write, the last of them to end writes it)
                workers = self.collection_manager.meta.get("num_workers", 1)
                self._writer.close(end_of_job=0 if self.is_copy else workers)
                unsaved = self._writer.unsaved_report()
                if unsaved:
                    logger.warning("smdebug: saving to %s is incomplete: %s", self._writer.uri, unsaved)
            elif self.shipped and not self.is_copy and not self.dry_run:
                # only the workers' copies wrote: the run they wrote is finished (within the close timeout)
                run_bounded(lambda: plugins.open_store(self.out_dir).write_bytes(END_OF_JOB_FILE, b""))
            if self._writer is None and getattr(self, "_out_dir_check", None) is not None:
                self._out_dir_check.release_if_unused()  # never wrote: leave nothing behind
        plugins.hook_closed(self)

    # -- copies ------------------------------------------------------------------------------------
    def __reduce__(self):
        """Pickled (Dask ships a training callback to its workers): rebuilt on the other side from the
        options, as a worker's copy that writes its own files into the same run."""
        self.shipped = True
        if not self.is_copy:
            self._close_at_exit()  # its copies train: the run they write is finished at exit at the latest
        return (_rebuild_copy, (type(self), self.copy_options(), self.collection_manager, self.copy_state()))

    def __repr__(self):
        return (
            f"<{type(self).__name__} out_dir={self.out_dir!r} step={self.step} mode={self.mode.name} "
            f"include_collections={self.include_collections}>"
        )


def _user_scalar(value):
    """A numpy scalar a script hands save_scalar/save_tensor (np.mean's np.float64): a 1-element array, as
    smdebug 1.0 saves any scalar given to it (a 0-d array or tensor keeps its shape)."""
    return np.array([value]) if isinstance(value, np.generic) else value


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
