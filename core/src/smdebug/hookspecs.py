"""Every extension point of smdebug. A plugin implements some of these with ``@hookimpl``.

Each specification's docstring is its whole contract: what it is for, its arguments (an implementation
takes only those it uses, by these names), what to return, and how the answers combine. A
``firstresult`` hook stops at the first implementation that returns something other than None (plugins
registered later are asked first; ``tryfirst``/``trylast`` move one); the others collect every answer.

Rules that hold for every hook, kept by ``smdebug.plugins``: an implementation that raises, or answers with
the wrong kind of value (the Returns below), is logged once per process and skipped (a firstresult hook then
asks the next one, finally the core's), except a ``ValueError`` from ``smdebug_reduce`` (undefined: see it); a
plugin that implements a hook not listed here, or takes an argument its hook does not have, is refused when it
loads, naming the closest one; hook wrappers (``wrapper=True`` or ``hookwrapper=True``) are honoured. A
plugin's observation hooks and the calls made once
(``smdebug_framework``, ``smdebug_open_store``, ``smdebug_rules``, ``smdebug_add_commands``) run on a thread
of the plugin's own while the caller waits: a call lasting over a second is logged once, and one lasting over
``SMDEBUG_PLUGIN_TIMEOUT`` seconds (5) is no longer waited for and the plugin is not called there again, so
that none can stall training or a process's start. The per-tensor capture hooks (``smdebug_to_numpy``,
``smdebug_host_view``, ``smdebug_reduce``, ``smdebug_reductions``, ``smdebug_to_host``) run in place on the
training thread, timed: a call over 6 x ``SMDEBUG_PLUGIN_TIMEOUT`` is logged once (while it runs, or when it
returns) and that hook of the plugin is skipped from then on, unless the plugin declares a framework
(``smdebug_framework``: its tensors' only reader, which may rightly wait that long for a device); a call that
never returns cannot be interrupted there, and training waits for it. A tensor lost because a plugin failed
and no other implementation could answer is recorded in the run naming the plugin and its error. Plugins are
found through the ``smdebug`` entry-point group; the core's own defaults (numpy capture and reductions, the
fsspec store, the built-in rules, the in-training rule runner, TensorBoard export) implement these same hooks
(``smdebug.defaults``).
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
    from smdebug.types import Store

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
    """Declare the framework this plugin serves.

    Called whenever smdebug needs the installed frameworks (activation at interpreter start,
    ``import smdebug.<alias>``, ``smdebug run``): do not import your framework here.

    Returns:
        A ``Framework``: its alias (``import smdebug.<alias>``), your import package, the imports that
        activate the plugin, the framework's distribution(s) and supported PEP 440 range. None for a
        plugin that serves no framework (a storage backend, an exporter).

    Every answer is used. The first plugin to declare an alias keeps it; a later declaration of the same
    alias is logged once and ignored. Likewise one import name activates one framework only: the first
    declared with it (a configuration builds one hook); the others are logged once.
    """


# -- capture and reduction -------------------------------------------------------------------------
@hookspec(firstresult=True)
def smdebug_to_numpy(value: Any) -> np.ndarray | None:
    """Copy a framework value to a host numpy array.

    Called for every value a hook saves raw, reduces on the host, or shows to an observer.

    Args:
        value: what the framework handed to the hook (a tensor, an array, a Python number, ...).

    Returns:
        A numpy array the caller owns (a copy: training may change the value afterwards), or None when
        the value is not one of your framework's.

    firstresult: the first array returned is used; the core's own implementation (numpy values, Python
    numbers, anything with ``__array__``) answers last.
    """


@hookspec(firstresult=True)
def smdebug_host_view(value: Any) -> np.ndarray | None:
    """A numpy view of a value that is already in host memory, without copying it (optional).

    Asked only when the writer process is in use and nothing observes saved tensors: it copies the view
    into the memory it shares with the training process before the hook returns, so that copy is the
    only one. Otherwise ``smdebug_to_numpy`` is asked for a copy.

    Args:
        value: what the framework handed to the hook.

    Returns:
        A numpy array sharing the value's memory (read before training goes on), or None: the value is
        not yours or not in host memory (``smdebug_to_numpy`` is then asked).

    firstresult: the first view returned is used.
    """


@hookspec(firstresult=True)
def smdebug_reduce(value: Any, reduction: str, abs: bool) -> float | None:
    """Compute one reduction of a value where it lives, so only a scalar crosses to the host.

    Args:
        value: what the framework handed to the hook.
        reduction: one of ``min``, ``max``, ``mean``, ``std``, ``variance``, ``sum``, ``prod``,
            ``median``, ``l1``, ``l2``.
        abs: reduce the absolute values.

    Returns:
        A float or a numpy scalar (its dtype is what is stored), or None: the core then reduces the array
        ``smdebug_to_numpy`` returns.

    Raises:
        ValueError: the reduction is undefined for this value (the max of an empty tensor). That is an
            answer, not a failure: the plugin is neither logged as failing nor skipped, no other
            implementation is asked, and the tensor is saved without that reduction, with one warning.
            Any other error is a failure, as for every hook (above).

    firstresult: the first answer is used; the core's numpy reduction answers last.
    """


@hookspec(firstresult=True)
def smdebug_reductions(values: list[Any], reductions: list[tuple[str, bool]]) -> list[Any] | None:
    """Start every reduction of a batch of values where they live, together and without waiting.

    The batched path: the hook gathers a step's values (``with hook.together():``), starts their
    reductions here, and brings all the results to the host at once through ``smdebug_to_host``.

    Args:
        values: the values, as the framework handed them to the hook.
        reductions: the ``(reduction, abs)`` pairs wanted of each value (names as in ``smdebug_reduce``).

    Returns:
        One result per value, in order: a framework object holding that value's reductions in the order
        of ``reductions``, or None for a value you leave to ``smdebug_reduce``. None when no value is
        yours.

    firstresult: the first list returned is used.
    """


@hookspec(firstresult=True)
def smdebug_to_host(results: list[Any]) -> Sequence[np.ndarray] | None:
    """Bring a step's ``smdebug_reductions`` results to the host in one transfer.

    Args:
        results: the non-None results your ``smdebug_reductions`` returned during the step.

    Returns:
        One 1-D numpy array per result (its reductions, in order), or a 2-D array whose rows they are
        (written as it is, without joining the rows again); None when the results are not yours.

    firstresult: the first answer is used; the core's answers last by converting each result with
    ``smdebug_to_numpy``.
    """


# -- storage ---------------------------------------------------------------------------------------
@hookspec(firstresult=True)
def smdebug_open_store(uri: str) -> Store | None:
    """Open the storage of one run, for a URI scheme you serve.

    Called for every output location a hook writes to and every run a Trial or the CLI reads.

    Args:
        uri: the run's location as the user gave it (``s3://bucket/run``, ``/local/path``, ...).

    Returns:
        An object with the members of the ``smdebug.types.Store`` protocol (no subclassing needed: the
        core calls only those), or None when the scheme is not yours.

    firstresult: the first store returned is used; the core's fsspec store (any fsspec URI) answers last.
    """


# -- activation ------------------------------------------------------------------------------------
@hookspec(firstresult=True)
def smdebug_activate(framework: Framework, module: Any) -> BaseHook | None:
    """Install your framework's hook into an unmodified script, just after the framework was imported.

    Called only for the plugin that declared ``framework``, only when a hook configuration is present
    (``SMDEBUG_CONFIG_FILE_PATH``, SageMaker's file, ``smdebug run``) and the installed framework is in
    the supported range.

    Args:
        framework: your ``Framework`` declaration.
        module: the framework's module, fully imported.

    Returns:
        The hook you attached (``Hook.create_from_json_file()``), or None.

    firstresult. Unlike the other hooks, an exception here reaches the core, which logs it in one line;
    the framework import still succeeds and the script runs without smdebug. It runs in place, inside the
    import: one still running after 6 x ``SMDEBUG_PLUGIN_TIMEOUT`` seconds (30) is named in one line.
    """


# -- observation -----------------------------------------------------------------------------------
@hookspec
def smdebug_step_begin(hook: BaseHook, mode: ModeKeys, step: int, mode_step: int) -> None:
    """Called when a hook starts a step.

    Args:
        hook: the hook (read its public state; do not save from here).
        mode: the hook's mode (``ModeKeys``).
        step: the global step number.
        mode_step: the step number within ``mode``.

    Returns:
        Nothing (the return value is ignored). Every implementation is called.
    """


@hookspec
def smdebug_step_end(hook: BaseHook, mode: ModeKeys, step: int, mode_step: int) -> None:
    """Called when a hook finishes a step and has queued its tensors for writing.

    Args:
        hook: the hook.
        mode: the hook's mode (``ModeKeys``).
        step: the global step number.
        mode_step: the step number within ``mode``.

    Returns:
        Nothing (the return value is ignored). Every implementation is called. A hook skips the call at
        the end of a step that saved nothing unless a plugin implements this hook.
    """


@hookspec
def smdebug_tensor_saved(hook: BaseHook, name: str, value: np.ndarray, step: int, mode: ModeKeys) -> None:
    """Called for every tensor (or reduction) a hook queues for saving.

    Args:
        hook: the hook.
        name: the tensor's name; a reduction's is its stored name,
            ``smdebug/reductions/<reduction>/<tensor>`` (``abs_<reduction>`` for an absolute one).
        value: the host numpy array saved (do not modify it).
        step: the global step number.
        mode: the hook's mode (``ModeKeys``).

    Returns:
        Nothing (the return value is ignored). Every implementation is called. Implementing this hook
        makes the hook copy each saved value for you: implement it only if you need it.
    """


@hookspec
def smdebug_hook_closed(hook: BaseHook) -> None:
    """Called when a hook has flushed everything and closed its writers.

    Args:
        hook: the hook (closed: its run is complete and readable).

    Returns:
        Nothing (the return value is ignored). Every implementation is called.
    """


# -- command line ----------------------------------------------------------------------------------
@hookspec
def smdebug_add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add subcommands to the ``smdebug`` command line.

    Args:
        subparsers: the command line's subparsers: ``subparsers.add_parser(name, help=...)``. Each parser
            sets ``func`` (``parser.set_defaults(func=run)``); ``func(args)`` returns the exit code.

    Returns:
        Nothing (the return value is ignored). Every implementation is called.
    """


# -- rules -----------------------------------------------------------------------------------------
@hookspec
def smdebug_rules() -> dict[str, type] | None:
    """Contribute built-in rules.

    Returns:
        A mapping of rule name to ``smdebug.rules.Rule`` subclass, or None. Every answer is used; the
        first plugin to contribute a name keeps it (the core's rules come first).
    """
