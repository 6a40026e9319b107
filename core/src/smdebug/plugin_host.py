"""The plugin host: smdebug's pluggy PluginManager, built on first use from the core's defaults and the
entry points of the ``smdebug`` group, each plugin validated (an implementation of a hook that does not
exist is refused, naming the closest real hook) and isolated; what was loaded, for ``smdebug plugins``;
pluggy's tracing when SMDEBUG_TRACE_PLUGINS asks for it."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import pluggy

from smdebug import hookspecs
from smdebug.exceptions import did_you_mean
from smdebug.plugin_calls import CallList, PluginCalls
from smdebug.plugin_isolation import (
    BOUNDED_HOOKS,
    CAPTURE_HOOKS,
    CaptureWatch,
    PluginThread,
    isolate,
    isolate_bounded,
    isolate_wrapper,
)

logger = logging.getLogger("smdebug")

PROJECT = "smdebug"
ENTRY_POINT_GROUP = "smdebug"
# The core's defaults go through the same hooks as any plugin (registered before entry points, so
# plugins that are registered later are called first and can override them).
DEFAULT_PLUGINS = ("smdebug.defaults", "smdebug.rules.runner")
# Hooks whose implementation's error is the caller's to handle (activation logs it in one line).
RAISING_HOOKS = frozenset({"smdebug_activate"})


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
            _check_arguments(self, plugin, name or self.get_canonical_name(plugin))
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
        self._host._threads.pop(name or self.get_name(plugin), None)
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


class PluginHost(PluginCalls):
    """The PluginManager of smdebug's hook specifications, the record of what was loaded, and one typed
    method per hook specification (each implementation isolated)."""

    def __init__(self, group: str = ENTRY_POINT_GROUP, defaults: Sequence[str] = DEFAULT_PLUGINS):
        self.group = group
        self.defaults = tuple(defaults)
        self._pm: _Manager | None = None
        self._lock = threading.RLock()
        # hook name -> [(plugin name, function, argnames, check)] called by a plain loop, or _THROUGH_PLUGGY;
        # read on every step and saved tensor, emptied whenever the plugins or the monitoring change
        self._calls: dict[str, CallList] = {}
        self._observers: dict[str, tuple[bool, bool]] = {}  # hook name -> _observers_of's answer, as _calls
        self._generation = 0
        self._failed: set[tuple[str, str]] = set()  # (plugin, hook) already reported
        self._declared_by: dict[str, str] = {}  # framework alias -> name of the plugin that declared it
        # entry-point name -> (entry point, disabled): loaded or not (for describe)
        self._entry_points: dict[str, tuple[metadata.EntryPoint, bool]] = {}
        self.load_errors: dict[str, str] = {}  # entry-point name -> why it failed to load
        self._untrace: Callable[[], Any] | None = None
        self._threads: dict[str, PluginThread] = {}  # plugin name -> where its BOUNDED_HOOKS run
        self._watch = CaptureWatch(self._report)  # times the CAPTURE_HOOKS, run in place

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
            self._threads.clear()

    def _changed(self) -> None:
        self._generation += 1
        self._calls.clear()
        self._observers.clear()

    def _load_entry_points(self, pm: _Manager) -> None:
        disabled = _disabled()
        names: set[str] = set()  # of the installed plugins, entry points and distributions
        for ep in metadata.entry_points(group=self.group):
            dist = getattr(ep, "dist", None)
            # a distribution's name costs a parse of its metadata file: read only when it is needed
            dist_name = dist.metadata["Name"] if dist is not None and disabled else None
            names.update((ep.name, dist_name or ep.name))
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
        for name in sorted(disabled - names):  # a typo would block nothing without a word
            logger.warning(
                "smdebug: SMDEBUG_DISABLE_PLUGINS names %r, which is no installed plugin%s (plugins: %s)",
                name,
                did_you_mean(name, names),
                ", ".join(sorted(names)) or "none",
            )

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
        # a framework's plugin is its tensors' only reader: slow, it is named but never dropped
        framework = any(caller.name == "smdebug_framework" for caller in callers)
        for caller in callers:
            firstresult = bool(caller.spec and caller.spec.opts.get("firstresult"))
            for impl in _own(caller, plugin):
                if impl.hookwrapper or impl.wrapper:
                    impl.function = isolate_wrapper(impl.function, name, caller.name, self._report)
                elif caller.name in RAISING_HOOKS or (firstresult and name in self.defaults):
                    continue  # its error is the caller's (the core's own answer of last resort)
                elif caller.name in BOUNDED_HOOKS and name not in self.defaults:
                    thread = PluginThread(name, self._report)
                    thread = self._threads.setdefault(name, thread)
                    impl.function = isolate_bounded(impl.function, thread, caller.name, self._report)
                else:
                    function = impl.function
                    if caller.name in CAPTURE_HOOKS and name not in self.defaults:
                        function = self._watch.timed(function, name, caller.name, keep=framework)
                    impl.function = isolate(function, name, caller.name, self._report)

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


def _required(function: Callable) -> list[str]:
    """The arguments pluggy passes to a function (those without a default; ``self`` is bound)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = inspect.signature(function).parameters.values()
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]


def _check_arguments(pm: pluggy.PluginManager, plugin: Any, name: str) -> None:
    """Refuse in one line a plugin whose implementation takes an argument its hook does not have (pluggy's
    own refusal is three lines naming neither the hook's arguments nor the closest one)."""
    for attr in dir(plugin):
        spec = getattr(hookspecs, attr, None) if attr.startswith("smdebug_") else None
        if spec is None or pm.parse_hookimpl_opts(plugin, attr) is None:
            continue
        try:
            taken = _required(getattr(plugin, attr))
        except (TypeError, ValueError):  # no signature: pluggy judges it
            continue
        allowed = _required(spec)
        unknown = [arg for arg in taken if arg not in allowed]
        if unknown:
            raise pluggy.PluginValidationError(
                plugin,
                f"plugin {name!r} implements {attr}({', '.join(taken)}), but the hook's arguments are "
                f"({', '.join(allowed)}): {', '.join(map(repr, unknown))} "
                f"{'is' if len(unknown) == 1 else 'are'} none of them{did_you_mean(unknown[0], allowed)}",
            )


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
