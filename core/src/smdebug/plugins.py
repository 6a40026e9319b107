"""The one PluginManager (entry-point discovery, broken plugins skipped) and its typed, isolated facade.

Nothing else in smdebug calls pluggy's hook relay: every hook specification has one function here, and
each call runs the implementations one at a time, each inside its own try/except. A plugin whose
implementation raises is logged once per process (naming the plugin and the hook) and skipped: an
observation hook still reaches the other plugins, and a capture, reduction or storage hook is answered by
the next implementation, finally the core's own (``smdebug.defaults``).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy

from smdebug import hookspecs
from smdebug.hookspecs import Framework

if TYPE_CHECKING:
    import argparse

    import numpy as np

    from smdebug.hook import BaseHook
    from smdebug.store import Store

__all__ = [
    "Framework",
    "activate",
    "add_commands",
    "frameworks",
    "get_plugin_manager",
    "hook_closed",
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

ENTRY_POINT_GROUP = "smdebug"
# The core's defaults go through the same hooks as any plugin (registered before entry points, so
# plugins that are registered later are called first and can override them).
DEFAULT_PLUGINS = ("smdebug.defaults",)

# Where the plugins for the aliases smdebug 1.0 users know live in this project.
KNOWN_ALIASES = {
    "pytorch": "smdebug-torch",
    "tensorflow": "smdebug-tf",
    "mxnet": "smdebug-mxnet",
    "xgboost": "smdebug-xgb",
}

_pm: pluggy.PluginManager | None = None
_lock = threading.RLock()
_declared_by: dict[str, str] = {}  # framework alias -> name of the plugin that declared it
_failed: set[tuple[str, str]] = set()  # (plugin, hook) already reported
load_errors: dict[str, str] = {}  # entry-point name -> why it failed to load (for error messages)


def _disabled() -> set[str]:
    raw = os.environ.get("SMDEBUG_DISABLE_PLUGINS", "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def _changed() -> None:
    _generation[0] += 1
    _impl_cache.clear()


class _Manager(pluggy.PluginManager):
    """Empties the facade's cached implementation lists whenever the plugins change (before and after:
    a list made meanwhile on another thread is not kept)."""

    def register(self, plugin, name=None):
        _changed()
        try:
            return super().register(plugin, name)
        finally:
            _changed()

    def unregister(self, plugin=None, name=None):
        _changed()
        try:
            return super().unregister(plugin, name)
        finally:
            _changed()

    def set_blocked(self, name):
        _changed()
        return super().set_blocked(name)

    def add_hookspecs(self, module_or_class):
        _changed()
        return super().add_hookspecs(module_or_class)


def get_plugin_manager() -> pluggy.PluginManager:
    """The PluginManager, built on first use: defaults first, then every entry point, each isolated."""
    global _pm
    if _pm is not None:
        return _pm
    with _lock:
        if _pm is None:
            pm = _Manager("smdebug")
            pm.add_hookspecs(hookspecs)
            for name in DEFAULT_PLUGINS:
                pm.register(importlib.import_module(name), name=name)
            _load_entry_points(pm)
            _pm = pm
    return _pm


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    disabled = _disabled()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        # a distribution's name costs a parse of its metadata file: read only when it is needed
        dist_name = dist.metadata["Name"] if dist is not None and disabled else None
        if ep.name in disabled or (dist_name and dist_name in disabled):
            logger.info("smdebug: plugin %r disabled by SMDEBUG_DISABLE_PLUGINS", ep.name)
            continue
        if pm.has_plugin(ep.name):
            continue
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:  # one broken plugin must not break the others
            load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
            logger.warning(
                "smdebug: plugin %r (%s) failed to load and is skipped: %s: %s",
                ep.name,
                dist.metadata["Name"] if dist is not None else ep.value,
                type(exc).__name__,
                exc,
            )


def reset() -> None:
    """Forget the loaded plugins (tests; entry points are read again on next use)."""
    global _pm
    with _lock:
        _pm = None
        _changed()
        _failed.clear()
        _declared_by.clear()
        load_errors.clear()


# -- calling implementations, each isolated --------------------------------------------------------
# hook name -> [(plugin name, implementation)]: read on every step and saved tensor, where pluggy's
# get_hookimpls would copy and the wrapper filter run each time; _Manager empties it when plugins change
_impl_cache: dict[str, list[tuple[str, Any]]] = {}
_generation = [0]


def _implementation_list(spec: str) -> list[tuple[str, Any]]:
    """(plugin name, implementation) of each implementation of a hook, in pluggy's order (last registered
    first, tryfirst/trylast honoured), cached until a plugin is registered or unregistered. Wrappers are
    not run."""
    found = _impl_cache.get(spec)
    if found is None:
        generation = _generation[0]
        pm = get_plugin_manager()
        found = [
            (impl.plugin_name, impl)
            for impl in reversed(getattr(pm.hook, spec).get_hookimpls())
            if not (impl.hookwrapper or getattr(impl, "wrapper", False))
        ]
        if pm is _pm and generation == _generation[0]:
            _impl_cache[spec] = found
    return found


def _implementations(spec: str, only: str | None = None) -> Iterator[tuple[str, Any]]:
    for plugin_name, impl in _implementation_list(spec):
        if only is None or plugin_name == only:
            yield plugin_name, impl


def _call_each(spec: str, **kwargs: Any) -> list[tuple[str, Any]]:
    """(plugin name, result) of each implementation that did not raise; one that raised is reported once.
    A plain loop over the cached list: step_begin and step_end call this at every step."""
    results = []
    for plugin_name, impl in _implementation_list(spec):
        try:
            result = impl.function(*map(kwargs.__getitem__, impl.argnames))
        except Exception as exc:
            _report(plugin_name, spec, exc)
        else:
            results.append((plugin_name, result))
    return results


def _first(spec: str, **kwargs: Any) -> Any:
    """firstresult: the first result that is not None, skipping implementations that raise (the core's
    own error is the caller's). Called per saved tensor: a plain loop over the cached list."""
    for plugin_name, impl in _implementation_list(spec):
        try:
            result = impl.function(*map(kwargs.__getitem__, impl.argnames))
        except Exception as exc:
            if plugin_name in DEFAULT_PLUGINS:
                raise
            _report(plugin_name, spec, exc)
            continue
        if result is not None:
            return result
    return None


def _notify(spec: str, **kwargs: Any) -> None:
    _call_each(spec, **kwargs)


def _report(plugin_name: str, hook_name: str, exc: Exception) -> None:
    if (plugin_name, hook_name) not in _failed:  # once per process, however often the hook is called
        _failed.add((plugin_name, hook_name))
        logger.warning(
            "smdebug: plugin %r failed in %s and is skipped: %s: %s",
            plugin_name,
            hook_name,
            type(exc).__name__,
            exc,
        )


# -- the typed facade: one function per hook specification -----------------------------------------
def frameworks() -> dict[str, Framework]:
    """Every framework the installed plugins serve, by alias. The first plugin to claim an alias keeps
    it; a later claim is logged and ignored."""
    found: dict[str, Framework] = {}
    for plugin_name, fw in _call_each("smdebug_framework"):
        if not isinstance(fw, Framework):
            continue
        owner = _declared_by.setdefault(fw.alias, plugin_name)
        if owner != plugin_name:
            if (plugin_name, f"alias:{fw.alias}") not in _failed:
                _failed.add((plugin_name, f"alias:{fw.alias}"))
                logger.warning(
                    "smdebug: plugin %r also declares the alias %r, which plugin %r serves; ignored",
                    plugin_name,
                    fw.alias,
                    owner,
                )
            continue
        found.setdefault(fw.alias, fw)
    return found


def activate(framework: Framework, module: Any) -> BaseHook | None:
    """Call ``smdebug_activate`` of the plugin that declared the framework (only that one). Its error is
    raised to the caller (smdebug.activation logs it without failing the framework import)."""
    if framework.alias not in _declared_by:
        frameworks()
    owner = _declared_by.get(framework.alias)
    for _, impl in _implementations("smdebug_activate", only=owner):
        result = impl.function(*({"framework": framework, "module": module}[a] for a in impl.argnames))
        if result is not None:
            return result
    return None


def to_numpy(value: Any) -> np.ndarray | None:
    return _first("smdebug_to_numpy", value=value)


def host_view(value: Any) -> np.ndarray | None:
    return _first("smdebug_host_view", value=value)


def reduce(value: Any, reduction: str, abs: bool = False) -> float | None:
    return _first("smdebug_reduce", value=value, reduction=reduction, abs=abs)


def reductions(values: list[Any], pairs: list[tuple[str, bool]]) -> list[Any] | None:
    """Every (reduction, abs) pair of each value, started together where the values live: one result per
    value, None for a value no plugin can reduce there (None: none of them)."""
    return _first("smdebug_reductions", values=values, reductions=pairs)


def to_host(results: list[Any]) -> Sequence[np.ndarray]:
    """The host arrays of a step's ``reductions`` results, brought over together."""
    return _first("smdebug_to_host", results=results)


def open_store(uri: str) -> Store:
    store = _first("smdebug_open_store", uri=uri)
    if store is None:
        raise ValueError(f"no storage backend can open {uri!r}")
    return store


def step_begin(hook: BaseHook) -> None:
    if _implementation_list("smdebug_step_begin"):  # most steps of most runs: nobody listens
        _notify("smdebug_step_begin", hook=hook, mode=hook.mode, step=hook.step, mode_step=hook.mode_step)


def step_end(hook: BaseHook) -> None:
    _call_each("smdebug_step_end", hook=hook, mode=hook.mode, step=hook.step, mode_step=hook.mode_step)


def tensor_saved(hook: BaseHook, name: str, value: np.ndarray) -> None:
    if not listens_to_tensors(hook):
        return
    _notify("smdebug_tensor_saved", hook=hook, name=name, value=value, step=hook.step, mode=hook.mode)


def listens_to_tensors(hook: BaseHook) -> bool:
    """Whether anything observes saved tensors (so the hook skips the call per saved tensor when nobody
    listens)."""
    return _observed("smdebug_tensor_saved", hook)


def listens_to_idle_steps(hook: BaseHook) -> bool:
    """Whether anything observes the end of a step that saved nothing, beyond the core's rule runner
    (which has only its stop-signal check to do there: the hook calls that itself)."""
    return _observed("smdebug_step_end", hook)


def _observed(spec: str, hook: BaseHook) -> bool:
    """A plugin implements the observation hook, or the core's own has work for this hook: TensorBoard."""
    for plugin_name, _ in _implementation_list(spec):
        if plugin_name not in DEFAULT_PLUGINS or getattr(hook, "tensorboard_dir", None) is not None:
            return True
    return False


def hook_closed(hook: BaseHook) -> None:
    _notify("smdebug_hook_closed", hook=hook)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    _notify("smdebug_add_commands", subparsers=subparsers)


def rules() -> dict[str, type]:
    """Built-in rules of the core and every plugin, by name (the first to contribute a name keeps it)."""
    found: dict[str, type] = {}
    for _, contributed in _call_each("smdebug_rules"):
        for name, cls in (contributed or {}).items():
            found.setdefault(name, cls)
    return found
