"""The one PluginManager: entry-point discovery, isolation of broken plugins, and a typed facade."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from importlib import metadata
from typing import Any

import pluggy

from smdebug import hookspecs

logger = logging.getLogger("smdebug")

ENTRY_POINT_GROUP = "smdebug"
# The core's defaults go through the same hooks as any plugin (registered before entry points, so
# plugins that are registered later are called first and can override them).
DEFAULT_PLUGINS = ("smdebug.defaults",)

# Distribution to install for the aliases smdebug 1.0 users know.
KNOWN_ALIASES = {
    "pytorch": "smdebug-torch",
    "tensorflow": "smdebug-tf",
    "mxnet": "smdebug-mxnet",
    "xgboost": "smdebug-xgb",
}


@dataclasses.dataclass(frozen=True)
class Framework:
    """What a framework plugin declares through ``smdebug_framework``."""

    alias: str  # import smdebug.<alias>
    package: str  # the plugin's import package, e.g. "smdebug_torch"
    import_names: tuple[str, ...] = ()  # importing one of these activates the plugin
    distribution: str | None = None  # the framework's distribution, for the version check
    supported: str = ""  # PEP 440 specifier, e.g. ">=2.0"

    def version_problem(self) -> str | None:
        """Why the installed framework is outside the supported range, or None when it is fine."""
        dist = self.distribution or (self.import_names[0] if self.import_names else None)
        if not dist or not self.supported:
            return None
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            return f"{dist} is not installed"
        from packaging.specifiers import SpecifierSet

        if not SpecifierSet(self.supported).contains(version, prereleases=True):
            return f"{dist} {version} is outside the supported range {self.supported}"
        return None


_pm: pluggy.PluginManager | None = None
_lock = threading.RLock()


def _disabled() -> set[str]:
    raw = os.environ.get("SMDEBUG_DISABLE_PLUGINS", "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def get_plugin_manager() -> pluggy.PluginManager:
    """The PluginManager, built on first use: defaults first, then every entry point, each isolated."""
    global _pm
    if _pm is not None:
        return _pm
    with _lock:
        if _pm is None:
            pm = pluggy.PluginManager("smdebug")
            pm.add_hookspecs(hookspecs)
            import importlib

            for name in DEFAULT_PLUGINS:
                pm.register(importlib.import_module(name), name=name)
            _load_entry_points(pm)
            _pm = pm
    return _pm


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    disabled = _disabled()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else None
        if ep.name in disabled or (dist_name and dist_name in disabled):
            logger.info("smdebug: plugin %r disabled by SMDEBUG_DISABLE_PLUGINS", ep.name)
            continue
        if pm.has_plugin(ep.name):
            continue
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:  # one broken plugin must not break the others
            logger.warning(
                "smdebug: plugin %r (%s) failed to load and is skipped: %s: %s",
                ep.name,
                dist_name or ep.value,
                type(exc).__name__,
                exc,
            )


def reset() -> None:
    """Forget the loaded plugins (tests; entry points are read again on next use)."""
    global _pm
    with _lock:
        _pm = None
        _failed.clear()
        _declared_by.clear()


def hook() -> Any:
    return get_plugin_manager().hook


# -- typed facade over the hooks -------------------------------------------------------------------
def frameworks() -> dict[str, Framework]:
    """Every framework the installed plugins serve, by alias (a plugin that fails to say is skipped)."""
    found: dict[str, Framework] = {}
    for plugin_name, fw, exc in _call_each("smdebug_framework"):
        if exc is not None:
            _log_failure(plugin_name, "smdebug_framework", exc)
        elif fw is not None and fw.alias not in found:
            found[fw.alias] = fw
            _declared_by[fw.alias] = plugin_name
    return found


def activate(framework: Framework, module: Any) -> Any:
    """The first hook an ``smdebug_activate`` implementation returns (see smdebug.activation). An error of
    the plugin that declared the framework is raised; another plugin's is logged and the next one is
    tried, so a broken plugin cannot stop another plugin's activation."""
    for plugin_name, result, exc in _call_each("smdebug_activate", framework=framework, module=module):
        if exc is not None:
            if plugin_name == _declared_by.get(framework.alias):
                raise exc
            _log_failure(plugin_name, "smdebug_activate", exc)
        elif result is not None:
            return result
    return None


_declared_by: dict[str, str] = {}  # framework alias -> name of the plugin that declared it
_failed: set[tuple[str, str]] = set()


def _call_each(name: str, **kwargs: Any):
    """(plugin name, result, exception) for each implementation of a hook, called one at a time in
    pluggy's order, each inside its own try/except. Wrappers are not run."""
    for impl in reversed(getattr(hook(), name).get_hookimpls()):
        if impl.hookwrapper or getattr(impl, "wrapper", False):
            continue
        try:
            result = impl.function(*(kwargs[arg] for arg in impl.argnames))
        except Exception as exc:
            yield impl.plugin_name, None, exc
        else:
            yield impl.plugin_name, result, None


def _log_failure(plugin_name: str, hook_name: str, exc: Exception) -> None:
    if (plugin_name, hook_name) not in _failed:  # once per process, however often the hook is called
        _failed.add((plugin_name, hook_name))
        logger.warning(
            "smdebug: plugin %r failed in %s and is skipped: %s: %s",
            plugin_name,
            hook_name,
            type(exc).__name__,
            exc,
        )


def to_numpy(value: Any):
    return hook().smdebug_to_numpy(value=value)


def reduce(value: Any, reduction: str, abs: bool = False) -> float | None:
    return hook().smdebug_reduce(value=value, reduction=reduction, abs=abs)


def open_store(uri: str):
    store = hook().smdebug_open_store(uri=uri)
    if store is None:
        raise ValueError(f"no storage backend can open {uri!r}")
    return store


def rules() -> dict[str, type]:
    found: dict[str, type] = {}
    for contributed in hook().smdebug_rules():
        found.update(contributed or {})
    return found
