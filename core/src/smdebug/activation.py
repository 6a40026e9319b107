"""Activation: an unmodified script gets a hook, built from the hook configuration, the moment it imports
a framework that an installed plugin serves.

How it starts: the core installs ``zz-smdebug-activation.pth`` into site-packages. The interpreter runs its
one line at startup; without importing anything it checks whether a hook configuration is present
(``SMDEBUG_CONFIG_FILE_PATH``, which ``smdebug run`` sets, or SageMaker's default path) and only then calls
:func:`startup`. That puts a post-import hook on ``sys.meta_path`` for the import names the installed
plugins declare (``Framework.import_names``). Right after one of them has been imported, :func:`activate`
checks the framework's version against ``Framework.supported`` and calls the ``smdebug_activate`` hook,
whose implementation in the plugin builds the hook and attaches it to the framework.

``SMDEBUG_DISABLE=1`` (or ``USE_SMDEBUG=0``) turns activation off. Nothing here may make the framework
import fail: every problem is logged as one line and the script runs without smdebug.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys
import threading
from typing import Any

logger = logging.getLogger("smdebug")

DISABLE_ENV = "SMDEBUG_DISABLE"
USE_ENV = "USE_SMDEBUG"  # smdebug 1.0's switch: USE_SMDEBUG=0 turns it off
# The same names as smdebug.json_config, repeated so that the startup check imports nothing heavy.
CONFIG_FILE_PATH_ENV = "SMDEBUG_CONFIG_FILE_PATH"
DEFAULT_CONFIG_PATH = "/opt/ml/input/config/debughookconfig.json"
# set by a process once it activated: the processes it starts (spawned DataLoader workers, a script's own
# subprocesses) inherit it with the configuration, and must not fail where their parent writes
ACTIVATED_PID_ENV = "SMDEBUG_ACTIVATED_PID"

# the spellings of distutils' strtobool, which smdebug 1.0 used for USE_SMDEBUG
_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off")

_lock = threading.RLock()
_finder: _PostImportFinder | None = None
_activated: dict[str, Any] = {}  # framework alias -> the hook its activation returned (or None)
_second_claims: set[tuple[str, str]] = set()  # (import name, plugin) reported as a second claim


def disabled_reason() -> str | None:
    """Why activation is turned off by the environment, or None."""
    value = os.environ.get(DISABLE_ENV, "").strip()
    if value.lower() in _TRUE:
        return f"{DISABLE_ENV}={value}"
    value = os.environ.get(USE_ENV, "").strip()
    if value.lower() in _FALSE:
        return f"{USE_ENV}={value}"
    return None


def configured() -> bool:
    """Whether a hook configuration is present (the check the startup file makes)."""
    return bool(os.environ.get(CONFIG_FILE_PATH_ENV)) or os.path.isfile(DEFAULT_CONFIG_PATH)


def startup() -> None:
    """Called by the startup file when a configuration is present. Never raises."""
    try:
        reason = disabled_reason()
        if reason is not None:
            logger.info("smdebug: activation turned off by %s", reason)
            return
        install()
    except Exception as exc:  # a broken environment must not stop the interpreter from starting
        logger.warning("smdebug: activation could not start: %s: %s", type(exc).__name__, exc)


def install() -> list[str]:
    """Watch the imports of every framework an installed plugin serves, and activate the frameworks
    already imported. Returns the import names watched."""
    global _finder
    from smdebug import plugins

    watched: dict[str, list] = {}
    for framework in plugins.frameworks().values():
        for name in framework.import_names:
            first = watched.setdefault(name, [framework])[0]
            if first.alias != framework.alias:  # one configuration, one hook: a second would clash
                _second_claim(name, first.alias, framework.alias)
    with _lock:
        if _finder is None:
            _finder = _PostImportFinder()
            sys.meta_path.insert(0, _finder)
        _finder.watched = dict(watched)
    for name in list(watched):
        module = sys.modules.get(name)
        if module is not None:
            _finder.imported(name, module)
    return sorted(watched)


def _second_claim(import_name: str, alias: str, other: str) -> None:
    from smdebug import plugins

    winner, loser = plugins.declared_by(alias), plugins.declared_by(other)
    if (import_name, loser) not in _second_claims:
        _second_claims.add((import_name, loser))
        logger.warning(
            "smdebug: plugins %r and %r both serve the import of %s; only %r is activated "
            "(SMDEBUG_DISABLE_PLUGINS=%s activates the other)",
            winner,
            loser,
            import_name,
            winner,
            winner,
        )


def uninstall() -> None:
    """Stop watching imports and forget which frameworks were activated (tests)."""
    global _finder
    with _lock:
        if _finder is not None and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _finder = None
        _activated.clear()
        _second_claims.clear()


def activate(framework, module) -> Any:
    """Activate one framework (once per process): check its version, then call ``smdebug_activate``.
    Returns the hook, or None when activation was skipped or failed (the reason is logged)."""
    with _lock:
        if framework.alias in _activated:
            return _activated[framework.alias]
        _activated[framework.alias] = None
    name = getattr(module, "__name__", "?")
    from smdebug.exceptions import ConfigError, OutDirExistsError

    try:
        problem = framework.version_problem()
        if problem is not None:
            logger.warning("smdebug: not activating %s on import of %s: %s", framework.alias, name, problem)
            return None
        from smdebug import plugins
        from smdebug.plugin_isolation import watched

        # in place (it attaches to the framework inside its import); a stall is named, never silent
        with watched(plugins.declared_by(framework.alias), "smdebug_activate", f"the import of {name}"):
            hook = plugins.activate(framework, module)
    except OutDirExistsError as exc:
        if not _started_by_activated_process():
            _bad_configuration(exc)
        # a process the activated one started (a spawned DataLoader worker, a subprocess of the script)
        # under the same worker name: its parent writes that run, and this process must not fail
        logger.info(
            "smdebug: not activating %s in this subprocess of process %s, which writes the run: %s",
            framework.alias,
            os.environ.get(ACTIVATED_PID_ENV),
            exc,
        )
        return None
    except ConfigError as exc:
        _bad_configuration(exc)
    except Exception as exc:
        logger.warning(
            "smdebug: activating %s on import of %s failed, the script runs without smdebug: %s: %s",
            framework.alias,
            name,
            type(exc).__name__,
            exc,
        )
        return None
    if hook is None:
        logger.info(  # a process the plugin skips (torch's launcher); the plugin says why
            "smdebug: %s not activated on import of %s: its plugin's smdebug_activate returned no hook",
            framework.alias,
            name,
        )
        return None
    logger.info(
        "smdebug: %s activated on import of %s, saving to %s",
        framework.alias,
        name,
        getattr(hook, "out_dir", "?"),
    )
    _activated[framework.alias] = hook
    os.environ[ACTIVATED_PID_ENV] = str(os.getpid())
    return hook


def after_import(name: str, callback) -> None:
    """Call ``callback(module)`` once the module ``name`` has been imported (now, when it is already): for
    a plugin's activation that attaches to a submodule its framework's import does not load
    (``xgboost.dask``). A callback that raises is logged as one line; the import goes on."""
    global _finder
    module = sys.modules.get(name)
    if module is None:
        with _lock:
            if _finder is None:
                _finder = _PostImportFinder()
                sys.meta_path.insert(0, _finder)
            _finder.callbacks.setdefault(name, []).append(callback)
            if name not in sys.modules:
                return
            _finder.callbacks[name].remove(callback)  # imported meanwhile
        module = sys.modules[name]
    _call_after_import(name, callback, module)


def _call_after_import(name: str, callback, module) -> None:
    try:
        callback(module)
    except Exception as exc:
        logger.warning("smdebug: after the import of %s: %s: %s", name, type(exc).__name__, exc)


def _started_by_activated_process() -> bool:
    """Whether another process activated with this environment and started this one."""
    pid = os.environ.get(ACTIVATED_PID_ENV, "")
    return pid.isdigit() and int(pid) != os.getpid()


def _bad_configuration(exc: Exception):
    """smdebug was asked for and its configuration is wrong: stop, as `smdebug run --config` does, rather
    than train for hours without it."""
    print(
        f"smdebug: bad hook configuration: {exc} (fix it, or unset {CONFIG_FILE_PATH_ENV} to train "
        "without smdebug)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None


def activated() -> dict[str, Any]:
    """The frameworks activated in this process so far, by alias, with their hooks."""
    return {alias: hook for alias, hook in _activated.items() if hook is not None}


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name it asks the other finders, and wraps the loader's
    ``exec_module`` so that activation runs once the module has executed completely."""

    def __init__(self):
        self.watched: dict[str, list] = {}
        self.callbacks: dict[str, list] = {}  # import name -> what after_import calls once it is imported
        self._busy: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        if (fullname not in self.watched and fullname not in self.callbacks) or fullname in self._busy:
            return None  # the common case: one or two dict lookups per import
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        patched = False

        def exec_then_activate(module):
            try:
                exec_module(module)
            finally:
                if patched:
                    del loader.exec_module  # back to the loader's own method
            self.imported(fullname, module)

        # Keep the framework's own loader object (module.__loader__ stays what the framework expects);
        # a class used as a loader (builtins), or one without an instance dict, gets wrapped instead.
        if not isinstance(loader, type):
            try:
                loader.exec_module = exec_then_activate
                patched = True
            except AttributeError:
                pass
        if not patched:
            spec.loader = _ActivatingLoader(loader, exec_then_activate)
        return spec

    def imported(self, name: str, module) -> None:
        for framework in self.watched.pop(name, ()):
            activate(framework, module)
        with _lock:
            callbacks = self.callbacks.pop(name, ())
        for callback in callbacks:
            _call_after_import(name, callback, module)


class _ActivatingLoader(importlib.abc.Loader):
    def __init__(self, loader, exec_module):
        self._loader = loader
        self.exec_module = exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):
        return getattr(self._loader, name)
