"""Calling the plugins' hook implementations (PluginHost's part): a typed method per hook specification,
each implementation isolated; through pluggy whenever a hook has a wrapper or the calls are monitored,
else by a plain loop over a cached list of the implementations (the per-step path)."""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from smdebug.hookspecs import Framework
from smdebug.plugin_isolation import UNDEFINED_IS_VALUE_ERROR, PluginFailed

if TYPE_CHECKING:
    import argparse

    import numpy as np

    from smdebug.hook import BaseHook
    from smdebug.types import Store

logger = logging.getLogger("smdebug")

# (plugin name, function, argnames, check) of each implementation of a hook, called by a plain loop; check:
# what its answer must be (_EXPECTED), for a plugin's implementation of a firstresult hook, else None
CallList = list[tuple[str, Callable, tuple[str, ...], Callable | None]]
# a cached call list's value for a hook that pluggy calls (truthy: someone may be listening)
_THROUGH_PLUGGY: Any = "through pluggy"


def _array(result: Any, kwargs: dict[str, Any]) -> str | None:
    import numpy as np

    return None if isinstance(result, np.ndarray) else "a numpy array"


def _scalar(result: Any, kwargs: dict[str, Any]) -> str | None:
    import numpy as np

    if isinstance(result, (numbers.Real, np.generic)) or (
        isinstance(result, np.ndarray) and result.size == 1
    ):
        return None
    return "a float or a numpy scalar"


def _per_value(result: Any, kwargs: dict[str, Any]) -> str | None:
    if isinstance(result, (list, tuple)) and len(result) == len(kwargs["values"]):
        return None
    return f"a list of {len(kwargs['values'])} results, one per value"


def _per_result(result: Any, kwargs: dict[str, Any]) -> str | None:
    import numpy as np

    count = len(kwargs["results"])
    if isinstance(result, np.ndarray):
        ok = result.ndim == 2 and len(result) == count
    else:
        ok = isinstance(result, (list, tuple)) and len(result) == count
        ok = ok and all(isinstance(row, np.ndarray) for row in result)
    return None if ok else f"{count} numpy arrays, one per result"


def _store(result: Any, kwargs: dict[str, Any]) -> str | None:
    from smdebug.types import Store

    members = [*Store.__annotations__, *(m for m in vars(Store) if not m.startswith("_"))]
    missing = [m for m in dict.fromkeys(members) if not hasattr(result, m)]
    if not missing:
        return None
    more = ", ..." if len(missing) > 4 else ""
    return f"a store (the members of smdebug.types.Store; it lacks {', '.join(missing[:4])}{more})"


# Capture hooks whose None means the value could not be handled at all (not "use another path"): when a
# plugin failed on the way and the core could not answer either, the caller is told which plugin
# (PluginFailed), so the run's record of the tensor names it
_ANSWER_NEEDED = frozenset({"smdebug_to_numpy", "smdebug_reduce", "smdebug_to_host"})

# What a plugin's firstresult answer must be (else it is reported once and the next implementation asked):
# a wrong answer must not cost the user a saved tensor
_EXPECTED: dict[str, Callable[[Any, dict[str, Any]], str | None]] = {
    "smdebug_to_numpy": _array,
    "smdebug_host_view": _array,
    "smdebug_reduce": _scalar,
    "smdebug_reductions": _per_value,
    "smdebug_to_host": _per_result,
    "smdebug_open_store": _store,  # called once a run: a store without the protocol's members broke it
}


class PluginCalls:
    """PluginHost's calls of the hook implementations; the host holds the PluginManager (``pm``), the
    cached call lists, and reports a failing implementation (``_report``)."""

    defaults: tuple[str, ...]
    _calls: dict[str, CallList]
    _observers: dict[str, tuple[bool, bool]]
    _generation: int
    _failed: set[tuple[str, str]]
    _declared_by: dict[str, str]
    pm: pluggy.PluginManager

    # -- calling the implementations, each isolated ------------------------------------------------
    def _call_list(self, spec: str) -> CallList:
        """(plugin name, function, argnames, check) of each implementation, in pluggy's order (last
        registered first, tryfirst/trylast honoured), or _THROUGH_PLUGGY when the hook has a wrapper or
        the calls are monitored (tracing). Cached until the plugins or the monitoring change."""
        generation = self._generation
        pm = self.pm
        impls = getattr(pm.hook, spec).get_hookimpls()
        if pm.monitors or any(impl.hookwrapper or impl.wrapper for impl in impls):
            found: CallList = _THROUGH_PLUGGY
        else:
            expected = _EXPECTED.get(spec)
            found = [
                (
                    impl.plugin_name,
                    getattr(impl.function, "_smdebug_plain", impl.function),
                    impl.argnames,
                    None if impl.plugin_name in self.defaults else expected,
                )
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
        failed = None  # (plugin, error) of the first plugin that failed in this call
        for plugin_name, function, argnames, check in calls:
            try:
                result = function(*map(kwargs.__getitem__, argnames))
            except Exception as exc:
                if isinstance(exc, ValueError) and spec in UNDEFINED_IS_VALUE_ERROR:
                    raise  # the value has none (an empty tensor's max): the answer, the caller's ValueError
                if plugin_name in self.defaults:
                    if failed is not None and spec in _ANSWER_NEEDED and not isinstance(exc, PluginFailed):
                        raise PluginFailed(failed[0], spec, failed[1], exc) from exc
                    raise
                self._report(plugin_name, spec, exc)
                failed = failed or (plugin_name, exc)
                continue
            if result is not None:
                if check is not None:
                    expected = check(result, kwargs)
                    if expected is not None:
                        wrong = TypeError(f"returned {type(result).__name__}, not {expected}")
                        self._report(plugin_name, spec, wrong)
                        failed = failed or (plugin_name, wrong)
                        continue
                return result
        if failed is not None and spec in _ANSWER_NEEDED:
            raise PluginFailed(failed[0], spec, failed[1], None)
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
        for plugin_name, function, argnames, _ in calls:
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
            for plugin_name, function, argnames, _ in calls:
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
            return [call[0] for call in calls]
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
                if fw is not None:
                    what = f"returned {type(fw).__name__}, not a smdebug.plugin.Framework"
                    self._report(plugin_name, "smdebug_framework", TypeError(what))
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

    def declared_by(self, alias: str) -> str | None:
        """The name of the plugin serving a framework alias (the first to declare it), or None."""
        if alias not in self._declared_by:
            self.frameworks()
        return self._declared_by.get(alias)

    def activate(self, framework: Framework, module: Any) -> BaseHook | None:
        """Call ``smdebug_activate`` of the plugin that declared the framework (only that one). Its error
        is raised to the caller (smdebug.activation logs it without failing the framework import)."""
        owner = self.declared_by(framework.alias)
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
        found = self._observers.get(spec)
        if found is None:
            found = self._observers_of(spec)
        by_plugin, by_default = found
        return by_plugin or (by_default and getattr(hook, "tensorboard_dir", None) is not None)

    def _observers_of(self, spec: str) -> tuple[bool, bool]:
        """(whether a plugin implements the hook, whether a default does): asked per saved tensor, cached
        until the plugins change, as the call lists."""
        generation = self._generation
        pm = self.pm
        names = self._implementers(spec)
        found = (any(n not in self.defaults for n in names), any(n in self.defaults for n in names))
        if pm is self._pm and generation == self._generation:
            self._observers[spec] = found
        return found

    def hook_closed(self, hook: BaseHook) -> None:
        self._each("smdebug_hook_closed", {"hook": hook})

    def add_commands(self, subparsers: argparse._SubParsersAction) -> None:
        self._each("smdebug_add_commands", {"subparsers": subparsers})

    def rules(self) -> dict[str, type]:
        """Built-in rules of the core and every plugin, by name (the first to contribute a name keeps
        it)."""
        found: dict[str, type] = {}
        for plugin_name, contributed in self._each_plugin("smdebug_rules", {}):
            if contributed is None:
                continue
            if not isinstance(contributed, dict) or not all(
                isinstance(c, type) for c in contributed.values()
            ):
                what = f"returned {type(contributed).__name__}, not a dict of rule names to rule classes"
                self._report(plugin_name, "smdebug_rules", TypeError(what))
                continue
            for name, cls in contributed.items():
                found.setdefault(name, cls)
        return found
