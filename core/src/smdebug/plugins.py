"""The plugin host: smdebug's one pluggy PluginManager, what it loaded, and a typed call per hook.

``PluginHost`` owns the PluginManager (built on first use: the core's defaults, then every entry point
of the ``smdebug`` group, each validated and isolated) and its caches. The module-level functions are
its default instance's (``host``), so the rest of the core calls ``plugins.to_numpy(value)`` and never
pluggy's hook relay.

Isolation: an implementation that raises is logged once per process (naming the plugin and the hook)
and skipped, whichever way it is called: an observation hook still reaches the other plugins, and a
capture, reduction or storage hook is answered by the next implementation, finally the core's own
(``smdebug.defaults``). Validation: a plugin implementing a hook that does not exist (a misspelling) is
refused at registration, naming the closest real hook.

Calls go through pluggy (its hook wrappers, ``add_hookcall_monitoring`` and tracing all apply), except
on the per-step path: a hook that has no wrapper, while nothing monitors the calls, has its
implementations called by a plain loop over a cached list, which costs a fraction of pluggy's call.
``SMDEBUG_TRACE_PLUGINS=1`` logs every hook call to the ``smdebug`` logger through pluggy's tracing.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy

from smdebug import hookspecs
from smdebug.hookspecs import Framework

if TYPE_CHECKING:
    import argparse

    import numpy as np

    from smdebug.hook import BaseHook
    from smdebug.types import Store

__all__ = [
    "Framework",
    "PluginHost",
    "PluginInfo",
    "activate",
    "add_commands",
    "describe",
    "frameworks",
    "get_plugin_manager",
    "hook_closed",
    "host",
    "open_store",
    "reduce",
    "reductions",
    "reset",
    "rules",
    "step_begin",
    "step_end",
    "tensor_saved",
    "to_host",
    "to_numpy",
]

logger = logging.getLogger("smdebug")

PROJECT = "smdebug"
ENTRY_POINT_GROUP = "smdebug"
# The core's defaults go through the same hooks as any plugin (registered before entry points, so
# plugins that are registered later are called first and can override them).
DEFAULT_PLUGINS = ("smdebug.defaults", "smdebug.rules.runner")
# Hooks whose implementation's error is the caller's to handle (activation logs it in one line).
RAISING_HOOKS = frozenset({"smdebug_activate"})

# Where the plugins for the aliases smdebug 1.0 users know live in this project.
KNOWN_ALIASES = {
    "pytorch": "smdebug-torch",
    "tensorflow": "smdebug-tf",
    "mxnet": "smdebug-mxnet",
    "xgboost": "smdebug-xgb",
}

# (plugin name, function, argnames) of each implementation of a hook, called by a plain loop
_Calls = list[tuple[str, Callable, tuple[str, ...]]]
# a cached call list's value for a hook that pluggy calls (truthy: someone may be listening)
_THROUGH_PLUGGY: Any = "through pluggy"


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """One plugin as ``smdebug plugins`` lists it."""

    name: str  # the entry point's name (the alias of a framework plugin) or the registered name
    distribution: str | None  # the distribution that installed it (None: registered by code)
    version: str | None
    hooks: tuple[str, ...]  # the hooks it implements (wrappers included)
    entry_point: str | None = None  # "module:attr" of the entry point
    error: str | None = None  # why it failed to load (it is then not registered)
    disabled: bool = False  # blocked by SMDEBUG_DISABLE_PLUGINS

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "hooks": list(self.hooks)}


def _disabled() -> set[str]:
    raw = os.environ.get("SMDEBUG_DISABLE_PLUGINS", "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def _tracing_requested() -> bool:
    return os.environ.get("SMDEBUG_TRACE_PLUGINS", "").strip().lower() not in ("", "0", "false", "no")


class _Manager(pluggy.PluginManager):
    """pluggy's PluginManager, telling its host when the plugins or the call monitoring change (before and
    after: a call list cached meanwhile on another thread is not kept), and having the host validate and
    isolate every plugin it registers."""

    def __init__(self, host: PluginHost):
        super().__init__(PROJECT)
        self._host = host
        self.monitors = 0  # add_hookcall_monitoring calls not undone: every call must go through pluggy

    def register(self, plugin, name=None):
        self._host._changed()
        try:
            name = super().register(plugin, name)
            if name is not None:  # None: a blocked name
                try:
                    self._host._adopt(self, plugin, name)
                except BaseException:
                    super().unregister(plugin)
                    raise
            return name
        finally:
            self._host._changed()

    def unregister(self, plugin=None, name=None):
        self._host._changed()
        try:
            return super().unregister(plugin, name)
        finally:
            self._host._changed()

    def set_blocked(self, name):
        self._host._changed()
        return super().set_blocked(name)

    def add_hookspecs(self, module_or_class):
        self._host._changed()
        return super().add_hookspecs(module_or_class)

    def add_hookcall_monitoring(self, before, after):
        undo_monitoring = super().add_hookcall_monitoring(before, after)
        self.monitors += 1
        self._host._changed()

        def undo() -> None:
            undo_monitoring()
            self.monitors -= 1
            self._host._changed()

        return undo


class PluginHost:
    """The PluginManager of smdebug's hook specifications, the record of what was loaded, and one typed
    method per hook specification (each implementation isolated)."""

    def __init__(self, group: str = ENTRY_POINT_GROUP, defaults: Sequence[str] = DEFAULT_PLUGINS):
        self.group = group
        self.defaults = tuple(defaults)
        self._pm: _Manager | None = None
        self._lock = threading.RLock()
        # hook name -> [(plugin name, function, argnames)] called by a plain loop, or _THROUGH_PLUGGY;
        # read on every step and saved tensor, emptied whenever the plugins or the monitoring change
        self._calls: dict[str, _Calls] = {}
        self._generation = 0
        self._failed: set[tuple[str, str]] = set()  # (plugin, hook) already reported
        self._declared_by: dict[str, str] = {}  # framework alias -> name of the plugin that declared it
        # entry-point name -> (entry point, disabled): loaded or not (for describe)
        self._entry_points: dict[str, tuple[metadata.EntryPoint, bool]] = {}
        self.load_errors: dict[str, str] = {}  # entry-point name -> why it failed to load
        self._untrace: Callable[[], Any] | None = None

    # -- the PluginManager -------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        """Whether the plugins were loaded (they are on first use)."""
        return self._pm is not None

    @property
    def pm(self) -> pluggy.PluginManager:
        """The PluginManager, built on first use: defaults first, then every entry point, each isolated."""
        pm = self._pm
        if pm is not None:
            return pm
        with self._lock:
            if self._pm is None:
                pm = _Manager(self)
                pm.add_hookspecs(hookspecs)
                if _tracing_requested():
                    self._trace(pm)
                for name in self.defaults:
                    pm.register(importlib.import_module(name), name=name)
                self._load_entry_points(pm)
                self._pm = pm
        return self._pm

    def reset(self) -> None:
        """Forget the loaded plugins (tests; entry points are read again on next use)."""
        with self._lock:
            self._pm = None
            if self._untrace is not None:  # the smdebug logger as it was before tracing
                self._untrace()
                self._untrace = None
            self._changed()
            self._failed.clear()
            self._declared_by.clear()
            self._entry_points.clear()
            self.load_errors.clear()

    def _changed(self) -> None:
        self._generation += 1
        self._calls.clear()

    def _load_entry_points(self, pm: _Manager) -> None:
        disabled = _disabled()
        for ep in metadata.entry_points(group=self.group):
            dist = getattr(ep, "dist", None)
            # a distribution's name costs a parse of its metadata file: read only when it is needed
            dist_name = dist.metadata["Name"] if dist is not None and disabled else None
            if ep.name in disabled or (dist_name and dist_name in disabled):
                logger.info("smdebug: plugin %r disabled by SMDEBUG_DISABLE_PLUGINS", ep.name)
                self._entry_points[ep.name] = (ep, True)
                continue
            if pm.has_plugin(ep.name):
                continue
            try:
                pm.register(ep.load(), name=ep.name)
            except Exception as exc:  # one broken plugin must not break the others
                self.load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
                logger.warning(
                    "smdebug: plugin %r (%s) failed to load and is skipped: %s: %s",
                    ep.name,
                    dist.metadata["Name"] if dist is not None else ep.value,
                    type(exc).__name__,
                    exc,
                )
            self._entry_points[ep.name] = (ep, False)

    def _info(self, ep: metadata.EntryPoint, disabled: bool, hooks: tuple[str, ...] = ()) -> PluginInfo:
        dist = getattr(ep, "dist", None)  # its metadata is read here only, not when plugins load
        return PluginInfo(
            name=ep.name,
            distribution=dist.metadata["Name"] if dist is not None else None,
            version=dist.version if dist is not None else None,
            hooks=hooks,
            entry_point=ep.value,
            error=self.load_errors.get(ep.name),
            disabled=disabled,
        )

    def _adopt(self, pm: pluggy.PluginManager, plugin: Any, name: str) -> None:
        """Validate a plugin pluggy has just registered (check_pending's rule, for this plugin: every
        implementation names a hook specification) and isolate each of its implementations."""
        callers = pm.get_hookcallers(plugin) or []
        for caller in callers:
            if not caller.has_spec() and any(not i.optionalhook for i in _own(caller, plugin)):
                close = difflib.get_close_matches(caller.name, _hook_names(), n=1)
                hint = f"did you mean {close[0]!r}?" if close else "smdebug.hookspecs lists the hooks"
                raise pluggy.PluginValidationError(
                    plugin, f"plugin {name!r} implements {caller.name!r}, which is no smdebug hook ({hint})"
                )
        for caller in callers:
            firstresult = bool(caller.spec and caller.spec.opts.get("firstresult"))
            for impl in _own(caller, plugin):
                if impl.hookwrapper or impl.wrapper:
                    impl.function = _isolated_wrapper(impl.function, name, caller.name, self._report)
                elif caller.name in RAISING_HOOKS or (firstresult and name in self.defaults):
                    continue  # its error is the caller's (the core's own answer of last resort)
                else:
                    impl.function = _isolated(impl.function, name, caller.name, self._report)

    def _report(self, plugin_name: str, hook_name: str, exc: BaseException) -> None:
        if (plugin_name, hook_name) not in self._failed:  # once per process, however often it is called
            self._failed.add((plugin_name, hook_name))
            logger.warning(
                "smdebug: plugin %r failed in %s and is skipped: %s: %s",
                plugin_name,
                hook_name,
                type(exc).__name__,
                exc,
            )

    def _trace(self, pm: _Manager) -> None:
        """Every hook call and its result, logged by pluggy's own tracing (all calls then go through it)."""
        level, handlers = logger.level, list(logger.handlers)

        def untrace() -> None:
            logger.setLevel(level)
            logger.handlers[:] = handlers

        self._untrace = untrace
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)  # asked for explicitly: make it visible
        if not logger.hasHandlers():
            logger.addHandler(logging.StreamHandler(sys.stderr))

        def write(message: str) -> None:
            logger.info("smdebug: plugin trace: %s", message.rstrip("\n"))

        pm.trace.root.setwriter(write)
        pm.enable_tracing()

    # -- what is installed -------------------------------------------------------------------------
    def describe(self) -> list[PluginInfo]:
        """Every plugin: the registered ones (the core's defaults first), then those that failed to load
        or were disabled, each with its distribution, version and the hooks it implements."""
        pm = self.pm
        found: list[PluginInfo] = []
        for name, plugin in pm.list_name_plugin():
            if plugin is None:
                continue
            hooks = tuple(sorted(caller.name for caller in pm.get_hookcallers(plugin) or ()))
            if name in self._entry_points:
                found.append(self._info(*self._entry_points[name], hooks=hooks))
            elif name in self.defaults:
                found.append(PluginInfo(name, "smdebug-core", _dist_version("smdebug-core"), hooks))
            else:
                found.append(PluginInfo(name, None, None, hooks))
        listed = {info.name for info in found}
        found += [self._info(*entry) for name, entry in self._entry_points.items() if name not in listed]
        return found

    # -- calling the implementations, each isolated ------------------------------------------------
    def _call_list(self, spec: str) -> _Calls:
        """(plugin name, function, argnames) of each implementation, in pluggy's order (last registered
        first, tryfirst/trylast honoured), or _THROUGH_PLUGGY when the hook has a wrapper or the calls
        are monitored (tracing). Cached until the plugins or the monitoring change."""
        generation = self._generation
        pm = self.pm
        impls = getattr(pm.hook, spec).get_hookimpls()
        if pm.monitors or any(impl.hookwrapper or impl.wrapper for impl in impls):
            found: _Calls = _THROUGH_PLUGGY
        else:
            found = [
                (impl.plugin_name, getattr(impl.function, "_smdebug_plain", impl.function), impl.argnames)
                for impl in reversed(impls)
            ]
        if pm is self._pm and generation == self._generation:
            self._calls[spec] = found
        return found

    def _first(self, spec: str, kwargs: dict[str, Any]) -> Any:
        """firstresult: the first result that is not None, skipping implementations that raise (the core's
        own error is the caller's). Called per saved tensor: a plain loop over the cached list."""
        calls = self._calls.get(spec)
        if calls is None:
            calls = self._call_list(spec)
        if calls is _THROUGH_PLUGGY:
            return getattr(self.pm.hook, spec)(**kwargs)
        for plugin_name, function, argnames in calls:
            try:
                result = function(*map(kwargs.__getitem__, argnames))
            except Exception as exc:
                if plugin_name in self.defaults:
                    raise
                self._report(plugin_name, spec, exc)
                continue
            if result is not None:
                return result
        return None

    def _each(self, spec: str, kwargs: dict[str, Any]) -> list[Any]:
        """The result of each implementation that did not raise (one that raised is reported once).
        step_begin and step_end call this at every step."""
        calls = self._calls.get(spec)
        if calls is None:
            calls = self._call_list(spec)
        if calls is _THROUGH_PLUGGY:
            return getattr(self.pm.hook, spec)(**kwargs)
        results = []
        for plugin_name, function, argnames in calls:
            try:
                results.append(function(*map(kwargs.__getitem__, argnames)))
            except Exception as exc:
                self._report(plugin_name, spec, exc)
        return results

    def _each_plugin(self, spec: str, kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
        """(plugin name, result) of each plugin's implementation that did not raise."""
        calls = self._calls.get(spec)
        if calls is None:
            calls = self._call_list(spec)
        if calls is not _THROUGH_PLUGGY:
            results = []
            for plugin_name, function, argnames in calls:
                try:
                    results.append((plugin_name, function(*map(kwargs.__getitem__, argnames))))
                except Exception as exc:
                    self._report(plugin_name, spec, exc)
            return results
        return [
            (name, result) for name in self._implementers(spec) for result in self._only(spec, name)(**kwargs)
        ]

    def _implementers(self, spec: str) -> list[str]:
        """The names of the plugins implementing a hook (not as a wrapper), in call order."""
        calls = self._calls.get(spec)
        if calls is None:
            calls = self._call_list(spec)
        if calls is not _THROUGH_PLUGGY:
            return [plugin_name for plugin_name, _, _ in calls]
        impls = getattr(self.pm.hook, spec).get_hookimpls()
        return [i.plugin_name for i in reversed(impls) if not (i.hookwrapper or i.wrapper)]

    def _only(self, spec: str, plugin_name: str | None) -> Callable[..., Any]:
        """The hook caller of one plugin's implementation (with every wrapper)."""
        pm = self.pm
        others = []
        for impl in getattr(pm.hook, spec).get_hookimpls():
            if impl.plugin_name != plugin_name and not (impl.hookwrapper or impl.wrapper):
                others.append(impl.plugin)
        return pm.subset_hook_caller(spec, others)

    # -- the typed facade: one method per hook specification ---------------------------------------
    def frameworks(self) -> dict[str, Framework]:
        """Every framework the installed plugins serve, by alias. The first plugin to claim an alias keeps
        it; a later claim is logged and ignored."""
        found: dict[str, Framework] = {}
        for plugin_name, fw in self._each_plugin("smdebug_framework", {}):
            if not isinstance(fw, Framework):
                continue
            owner = self._declared_by.setdefault(fw.alias, plugin_name)
            if owner != plugin_name:
                if (plugin_name, f"alias:{fw.alias}") not in self._failed:
                    self._failed.add((plugin_name, f"alias:{fw.alias}"))
                    logger.warning(
                        "smdebug: plugin %r also declares the alias %r, which plugin %r serves; ignored",
                        plugin_name,
                        fw.alias,
                        owner,
                    )
                continue
            found.setdefault(fw.alias, fw)
        return found

    def activate(self, framework: Framework, module: Any) -> BaseHook | None:
        """Call ``smdebug_activate`` of the plugin that declared the framework (only that one). Its error
        is raised to the caller (smdebug.activation logs it without failing the framework import)."""
        if framework.alias not in self._declared_by:
            self.frameworks()
        owner = self._declared_by.get(framework.alias)
        if owner is None:
            return None
        return self._only("smdebug_activate", owner)(framework=framework, module=module)

    def to_numpy(self, value: Any) -> np.ndarray | None:
        return self._first("smdebug_to_numpy", {"value": value})

    def host_view(self, value: Any) -> np.ndarray | None:
        return self._first("smdebug_host_view", {"value": value})

    def reduce(self, value: Any, reduction: str, abs: bool = False) -> float | None:
        return self._first("smdebug_reduce", {"value": value, "reduction": reduction, "abs": abs})

    def reductions(self, values: list[Any], pairs: list[tuple[str, bool]]) -> list[Any] | None:
        """Every (reduction, abs) pair of each value, started together where the values live: one result
        per value, None for a value no plugin can reduce there (None: none of them)."""
        return self._first("smdebug_reductions", {"values": values, "reductions": pairs})

    def to_host(self, results: list[Any]) -> Sequence[np.ndarray]:
        """The host arrays of a step's ``reductions`` results, brought over together."""
        return self._first("smdebug_to_host", {"results": results})

    def open_store(self, uri: str) -> Store:
        store = self._first("smdebug_open_store", {"uri": uri})
        if store is None:
            raise ValueError(f"no storage backend can open {uri!r}")
        return store

    def step_begin(self, hook: BaseHook) -> None:
        calls = self._calls.get("smdebug_step_begin")
        if calls is None:
            calls = self._call_list("smdebug_step_begin")
        if calls:  # most steps of most runs: nobody listens
            self._each(
                "smdebug_step_begin",
                {"hook": hook, "mode": hook.mode, "step": hook.step, "mode_step": hook.mode_step},
            )

    def step_end(self, hook: BaseHook) -> None:
        self._each(
            "smdebug_step_end",
            {"hook": hook, "mode": hook.mode, "step": hook.step, "mode_step": hook.mode_step},
        )

    def tensor_saved(self, hook: BaseHook, name: str, value: np.ndarray) -> None:
        if self.listens_to_tensors(hook):
            self._each(
                "smdebug_tensor_saved",
                {"hook": hook, "name": name, "value": value, "step": hook.step, "mode": hook.mode},
            )

    def listens_to_tensors(self, hook: BaseHook) -> bool:
        """Whether anything observes saved tensors (so the hook skips the call per saved tensor when
        nobody listens)."""
        return self._observed("smdebug_tensor_saved", hook)

    def listens_to_idle_steps(self, hook: BaseHook) -> bool:
        """Whether anything observes the end of a step that saved nothing, beyond the core's rule runner
        (which has only its stop-signal check to do there: the hook calls that itself)."""
        return self._observed("smdebug_step_end", hook)

    def _observed(self, spec: str, hook: BaseHook) -> bool:
        """A plugin implements the observation hook, or the core's own has work for this hook:
        TensorBoard."""
        calls = self._calls.get(spec)
        if calls is None:
            calls = self._call_list(spec)
        if calls is _THROUGH_PLUGGY:
            calls = [(name, None, ()) for name in self._implementers(spec)]
        for plugin_name, _, _ in calls:
            if plugin_name not in self.defaults or getattr(hook, "tensorboard_dir", None) is not None:
                return True
        return False

    def hook_closed(self, hook: BaseHook) -> None:
        self._each("smdebug_hook_closed", {"hook": hook})

    def add_commands(self, subparsers: argparse._SubParsersAction) -> None:
        self._each("smdebug_add_commands", {"subparsers": subparsers})

    def rules(self) -> dict[str, type]:
        """Built-in rules of the core and every plugin, by name (the first to contribute a name keeps
        it)."""
        found: dict[str, type] = {}
        for contributed in self._each("smdebug_rules", {}):
            for name, cls in (contributed or {}).items():
                found.setdefault(name, cls)
        return found


def _own(caller: pluggy.HookCaller, plugin: Any) -> list[Any]:
    return [impl for impl in caller.get_hookimpls() if impl.plugin is plugin]


@functools.cache
def _hook_names() -> tuple[str, ...]:
    return tuple(name for name in dir(hookspecs) if name.startswith("smdebug_"))


def _dist_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _isolated(function: Callable, plugin_name: str, hook_name: str, report: Callable) -> Callable:
    """The implementation as pluggy calls it: its error reported once and its answer taken as None."""

    @functools.wraps(function)
    def isolated(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            report(plugin_name, hook_name, exc)
            return None

    isolated._smdebug_plain = function  # what the plain loop calls (it catches errors itself)
    return isolated


def _isolated_wrapper(function: Callable, plugin_name: str, hook_name: str, report: Callable) -> Callable:
    """A hook wrapper (new or old style) whose own failure is reported once and leaves the call as if
    the wrapper were not there; what it does with the call's result or error is kept."""

    @functools.wraps(function)
    def isolated(*args, **kwargs):
        try:
            wrapper = function(*args, **kwargs)
            next(wrapper)
        except Exception as exc:  # StopIteration too: it did not yield
            report(plugin_name, hook_name, exc)
            return (yield)
        try:
            outcome = yield
        except BaseException as exc:  # the call raised (new style): the wrapper sees it
            try:
                wrapper.throw(exc)
            except StopIteration as stop:
                return stop.value
            wrapper.close()
            report(plugin_name, hook_name, RuntimeError("the wrapper yielded a second time"))
            raise
        try:
            wrapper.send(outcome)
        except StopIteration as stop:
            return stop.value
        except Exception as exc:
            report(plugin_name, hook_name, exc)
            return outcome
        wrapper.close()
        report(plugin_name, hook_name, RuntimeError("the wrapper yielded a second time"))
        return outcome

    return isolated


# -- the default host, and its methods as this module's functions (what the core calls) ------------
host = PluginHost()
load_errors = host.load_errors


def get_plugin_manager() -> pluggy.PluginManager:
    """The default host's PluginManager (built on first use)."""
    return host.pm


reset = host.reset
describe = host.describe
frameworks = host.frameworks
activate = host.activate
to_numpy = host.to_numpy
host_view = host.host_view
reduce = host.reduce
reductions = host.reductions
to_host = host.to_host
open_store = host.open_store
step_begin = host.step_begin
step_end = host.step_end
tensor_saved = host.tensor_saved
listens_to_tensors = host.listens_to_tensors
listens_to_idle_steps = host.listens_to_idle_steps
hook_closed = host.hook_closed
add_commands = host.add_commands
rules = host.rules
