"""Every extension point of smdebug. A plugin implements some of these with ``@hookimpl``.

Plugins are found through the ``smdebug`` entry-point group (see ``smdebug.plugins``, which also calls
them, each implementation isolated from the others); the core's own defaults (numpy capture and
reductions, the fsspec store, the built-in rules, the in-training rule runner, TensorBoard export) are
registered through these same hooks by ``smdebug.defaults``.
"""

from __future__ import annotations

import dataclasses
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    import numpy as np

    from smdebug.hook import BaseHook
    from smdebug.modes import ModeKeys
    from smdebug.store import Store

hookspec = pluggy.HookspecMarker("smdebug")
hookimpl = pluggy.HookimplMarker("smdebug")


@dataclasses.dataclass(frozen=True)
class Framework:
    """What a framework plugin declares through ``smdebug_framework``."""

    alias: str  # import smdebug.<alias>
    package: str  # the plugin's import package, e.g. "smdebug_torch"
    import_names: tuple[str, ...] = ()  # importing one of these activates the plugin
    distribution: str | None = None  # the framework's distribution, for the version check
    supported: str = ""  # PEP 440 specifier, e.g. ">=2.0"
    distributions: tuple[str, ...] = ()  # more distributions providing it (xgboost, xgboost-cpu)

    def installed_version(self) -> tuple[str, str] | None:
        """(distribution, version) of the first installed distribution of the framework, or None."""
        names = (self.distribution, *self.distributions) if self.distribution else self.distributions
        for name in names or self.import_names[:1]:
            try:
                return name, metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    def version_problem(self) -> str | None:
        """Why the installed framework is outside the supported range, or None when it is fine."""
        if not self.supported:
            return None
        found = self.installed_version()
        if found is None:
            names = (self.distribution, *self.distributions) if self.distribution else self.distributions
            return f"{' or '.join(names or self.import_names[:1])} is not installed"
        dist, version = found
        from packaging.specifiers import SpecifierSet

        if not SpecifierSet(self.supported).contains(version, prereleases=True):
            return f"{dist} {version} is outside the supported range {self.supported}"
        return None


# -- framework registration ------------------------------------------------------------------------
@hookspec
def smdebug_framework() -> Framework | None:
    """Describe the framework this plugin serves (alias, package, trigger imports, supported versions)."""


# -- capture and reduction -------------------------------------------------------------------------
@hookspec(firstresult=True)
def smdebug_to_numpy(value: Any) -> np.ndarray | None:
    """Copy a framework value to a host numpy array, or return None when the value is not yours."""


@hookspec(firstresult=True)
def smdebug_host_view(value: Any) -> np.ndarray | None:
    """A numpy view of a value held in host memory, read before training goes on (no copy), or None."""


@hookspec(firstresult=True)
def smdebug_reduce(value: Any, reduction: str, abs: bool) -> float | None:
    """Compute one reduction of a value where it lives; a float (a numpy scalar's dtype is stored) or None."""


@hookspec(firstresult=True)
def smdebug_reductions(values: list[Any], reductions: list[tuple[str, bool]]) -> list[Any] | None:
    """Start every (reduction, abs) of each value where it lives, together: one result each (None: not here)."""


@hookspec(firstresult=True)
def smdebug_to_host(results: list[Any]) -> Sequence[np.ndarray] | None:
    """Bring a step's smdebug_reductions results to the host together: an array each, or their 2-D array."""


# -- storage ---------------------------------------------------------------------------------------
@hookspec(firstresult=True)
def smdebug_open_store(uri: str) -> Store | None:
    """Return a Store that reads and writes under uri, or None when the scheme is not yours."""


# -- activation ------------------------------------------------------------------------------------
@hookspec(firstresult=True)
def smdebug_activate(framework: Framework, module: Any) -> BaseHook | None:
    """Install your framework's hook into an unmodified script just after ``module`` was imported."""


# -- observation -----------------------------------------------------------------------------------
@hookspec
def smdebug_step_begin(hook: BaseHook, mode: ModeKeys, step: int, mode_step: int) -> None:
    """Called when a hook starts a step."""


@hookspec
def smdebug_step_end(hook: BaseHook, mode: ModeKeys, step: int, mode_step: int) -> None:
    """Called when a hook finishes a step and has queued its tensors for writing."""


@hookspec
def smdebug_tensor_saved(hook: BaseHook, name: str, value: np.ndarray, step: int, mode: ModeKeys) -> None:
    """Called for every tensor (or reduction) a hook queues for saving."""


@hookspec
def smdebug_hook_closed(hook: BaseHook) -> None:
    """Called when a hook has flushed everything and closed its writers."""


# -- command line ----------------------------------------------------------------------------------
@hookspec
def smdebug_add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add subcommands to the ``smdebug`` command line (each parser sets ``func(args) -> exit code``)."""


# -- rules -----------------------------------------------------------------------------------------
@hookspec
def smdebug_rules() -> dict[str, type] | None:
    """Contribute built-in rules as a mapping of rule name to Rule subclass."""
