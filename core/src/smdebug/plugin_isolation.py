"""Isolating a plugin's hook implementations: an implementation (or hook wrapper) that raises is reported
once (naming the plugin and the hook) and its call goes on as if it were not there; a plugin's observation
hooks and calls made once run on a thread of their own, waited for at most SMDEBUG_PLUGIN_TIMEOUT seconds;
its per-tensor capture hooks run in place, timed, and are dropped once a call outlasts its budget."""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from smdebug.env import env_number

logger = logging.getLogger("smdebug")


# Hooks whose ValueError is an answer, not a failure: the value has none (an empty tensor's max is
# undefined). It goes to the caller as the core's own would (the tensor is saved without that reduction,
# with one warning), the plugin is not reported nor skipped, and no other implementation is asked.
UNDEFINED_IS_VALUE_ERROR = frozenset({"smdebug_reduce"})


def isolate(function: Callable, plugin_name: str, hook_name: str, report: Callable) -> Callable:
    """The implementation as pluggy calls it: its error reported once and its answer taken as None."""
    undefined = ValueError if hook_name in UNDEFINED_IS_VALUE_ERROR else ()

    @functools.wraps(function)
    def isolated(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except undefined:
            raise
        except Exception as exc:
            report(plugin_name, hook_name, exc)
            return None

    isolated._smdebug_plain = function  # what the plain loop calls (it catches errors itself)
    return isolated


def isolate_wrapper(function: Callable, plugin_name: str, hook_name: str, report: Callable) -> Callable:
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


# Hooks a plugin's implementations of run on a thread of the plugin's own, so that one that hangs or is
# slow cannot stall training or a process's start: the observers (their answer is ignored) and the calls
# made once (a declaration, a run's store, rules, commands). The core's own run in place; so do the
# per-tensor capture hooks (a thread switch per tensor) and activation (it runs inside the framework's
# import).
BOUNDED_HOOKS = frozenset(
    {
        "smdebug_step_begin",
        "smdebug_step_end",
        "smdebug_tensor_saved",
        "smdebug_hook_closed",
        "smdebug_framework",
        "smdebug_open_store",
        "smdebug_rules",
        "smdebug_add_commands",
    }
)
TIMEOUT_ENV = "SMDEBUG_PLUGIN_TIMEOUT"
DEFAULT_TIMEOUT = 5.0  # seconds a caller waits for one such call before it drops the plugin
SLOW = 1.0  # seconds: a call this long is named once (training waited for it)
# An activation may import much of its framework (a hook module, Keras' trainer): waited for longer
# before it is named (30 s by default)
PATIENCE = 6


class PluginHung(Exception):
    """A plugin's call did not return within the plugin timeout."""


class PluginFailed(RuntimeError):
    """A plugin's capture or reduction failed and no other implementation could answer in its place:
    what the run records for the tensor names the plugin."""

    def __init__(self, plugin_name: str, hook_name: str, error: BaseException, then: BaseException | None):
        fallback = f"the core could not answer either: {_said(then)}" if then else "no other one answered"
        super().__init__(f"plugin {plugin_name!r} failed in {hook_name} ({_said(error)}); {fallback}")


def _said(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class PluginThread:
    """The thread one plugin's BOUNDED_HOOKS run on. The caller waits for each call at most
    SMDEBUG_PLUGIN_TIMEOUT seconds; a call that takes longer raises PluginHung (reported once), and the
    plugin's calls here are skipped from then on, its thread left to finish on its own."""

    def __init__(self, plugin_name: str, report: Callable):
        self.plugin_name = plugin_name
        self.report = report
        self.hung = False
        self.slow_named = False
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def _started(self) -> queue.SimpleQueue | None:
        with self._lock:
            if self._queue is None or self._pid != os.getpid():  # a forked child has no such thread
                calls: queue.SimpleQueue = queue.SimpleQueue()
                thread = threading.Thread(
                    target=_serve, args=(calls,), name=f"smdebug-plugin-{self.plugin_name}", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError:  # interpreter shutdown: called in place
                    return None
                self._queue, self._thread, self._pid = calls, thread, os.getpid()
            return self._queue

    def call(self, function: Callable, hook_name: str, args: tuple, kwargs: dict):
        if self.hung:
            return None  # reported when it hung
        if threading.current_thread() is self._thread:  # called from its own call: it would wait on itself
            return function(*args, **kwargs)
        calls = self._started()
        if calls is None:
            return function(*args, **kwargs)
        timeout = env_number(TIMEOUT_ENV, DEFAULT_TIMEOUT, positive=True)
        done = threading.Lock()
        done.acquire()
        outcome: list = []
        start = time.perf_counter()
        calls.put((function, args, kwargs, outcome, done))
        if not done.acquire(timeout=timeout):
            self.hung = True
            raise PluginHung(
                f"it did not return within {timeout:g} s ({TIMEOUT_ENV}) and is not called again"
            )
        took = time.perf_counter() - start
        if took >= SLOW and not self.slow_named:
            self.slow_named = True
            logger.warning(
                "smdebug: plugin %r took %.1f s in %s and training waited for it (a call over %s=%g s "
                "is not waited for, and the plugin is skipped from then on)",
                self.plugin_name,
                took,
                hook_name,
                TIMEOUT_ENV,
                timeout,
            )
        ok, value = outcome[0]
        if not ok:
            raise value
        return value


# The per-tensor capture hooks run in place, on the caller's thread: a thread switch per tensor would cost
# more than most of their calls.
CAPTURE_HOOKS = frozenset(
    {"smdebug_to_numpy", "smdebug_host_view", "smdebug_reduce", "smdebug_reductions", "smdebug_to_host"}
)


class CaptureWatch:
    """Times the plugins' per-tensor capture calls, which run in place (on the training thread). A call
    that outlasts its budget (PATIENCE x SMDEBUG_PLUGIN_TIMEOUT, 30 s) is named once, by a watcher thread
    while it still runs or when it returns, and from then on that plugin's hook raises PluginHung in
    place of being called (the next implementation answers, finally the core's). A framework's plugin
    (one declaring ``smdebug_framework``) is named but kept: it is its tensors' only reader, and a call of
    it may rightly wait that long for a device's queued work (a long step on a GPU). A call that never
    returns cannot be interrupted on the thread it runs on: training waits for it, and the log says
    which plugin it waits for."""

    def __init__(self, report: Callable):
        self.report = report
        # thread -> (plugin, hook, start, budget, the hook's cell) of the capture call it is in
        self.running: dict[int, tuple] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._interval = 60.0
        if hasattr(os, "register_at_fork"):  # a forked child has no watcher thread: started again there
            os.register_at_fork(after_in_child=self._forked)

    def timed(self, function: Callable, plugin_name: str, hook_name: str, keep: bool = False) -> Callable:
        """The implementation, timed; ``cell[0]`` holds the PluginHung it raises once over budget (with
        ``keep``, the reason it was named and goes on being called)."""
        budget = env_number(TIMEOUT_ENV, DEFAULT_TIMEOUT, positive=True) * PATIENCE
        self._interval = max(0.05, min(self._interval, budget / 4))
        cell: list = [None, keep]
        running, clock, ident = self.running, time.perf_counter, threading.get_ident

        def timed(*args):  # (pluggy and the plain loop pass the arguments by position)
            if cell[0] is not None and not keep:
                raise cell[0]
            if self._thread is None:
                self._start()
            thread = ident()
            outer = running.get(thread)  # a capture call made from inside another one
            start = clock()
            running[thread] = (plugin_name, hook_name, start, budget, cell)
            try:
                return function(*args)
            finally:
                took = clock() - start
                if outer is None:
                    running.pop(thread, None)
                else:
                    running[thread] = outer
                if took > budget and cell[0] is None:
                    self._over(
                        plugin_name,
                        hook_name,
                        cell,
                        f"one call took {took:.1f} s on the training thread, over {budget:g} s "
                        f"({PATIENCE} x {TIMEOUT_ENV})",
                        ", and it is not called there again",
                    )

        return timed

    def _over(self, plugin_name: str, hook_name: str, cell: list, why: str, dropped: str) -> None:
        with self._lock:
            if cell[0] is not None:
                return
            cell[0] = PluginHung(why if cell[1] else why + dropped)
        if cell[1]:
            logger.warning(
                "smdebug: plugin %r is slow in %s: %s; it reads its framework's tensors, so it is called again",
                plugin_name,
                hook_name,
                why,
            )
        else:
            self.report(plugin_name, hook_name, cell[0])

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="smdebug-capture-watch", daemon=True)
                try:
                    self._thread.start()
                except RuntimeError:  # interpreter shutdown: nothing left to watch
                    pass

    def _forked(self) -> None:
        self._thread = None
        self._lock = threading.Lock()
        self.running.clear()

    def _watch(self) -> None:
        while True:
            time.sleep(self._interval)
            now = time.perf_counter()
            for plugin_name, hook_name, start, budget, cell in list(self.running.values()):
                if cell[0] is None and now - start > budget:
                    self._over(
                        plugin_name,
                        hook_name,
                        cell,
                        f"it has not returned for {budget:g} s ({PATIENCE} x {TIMEOUT_ENV}) and training "
                        f"waits for it: a call on the training thread cannot be interrupted "
                        f"(SMDEBUG_DISABLE_PLUGINS={plugin_name} turns the plugin off)",
                        "; once it returns it is not called there again",
                    )


def _serve(calls: queue.SimpleQueue) -> None:
    while True:
        function, args, kwargs, outcome, done = calls.get()
        try:
            outcome.append((True, function(*args, **kwargs)))
        except BaseException as exc:
            outcome.append((False, exc))
        finally:
            done.release()
        del function, args, kwargs, outcome, done  # the hook and its values are not held between calls


def isolate_bounded(function: Callable, thread: PluginThread, hook_name: str, report: Callable) -> Callable:
    """An implementation of one of BOUNDED_HOOKS, run on its plugin's thread (``isolate`` otherwise)."""

    def bounded(*args, **kwargs):
        return thread.call(function, hook_name, args, kwargs)

    isolated = isolate(bounded, thread.plugin_name, hook_name, report)
    functools.update_wrapper(isolated, function)
    isolated._smdebug_plain = bounded
    return isolated


@contextmanager
def watched(plugin_name: str | None, hook_name: str, waiting: str) -> Iterator[None]:
    """A call that must run in place (activation, inside the framework's import): when it lasts over the
    plugin timeout ``PATIENCE`` times over, one line names the plugin while the call still runs, so a
    stall is never silent."""
    timeout = env_number(TIMEOUT_ENV, DEFAULT_TIMEOUT, positive=True) * PATIENCE
    timer = threading.Timer(
        timeout,
        logger.warning,
        (
            "smdebug: plugin %r has not returned from %s for %g s; %s waits for it "
            "(SMDEBUG_DISABLE_PLUGINS=%s turns it off)",
            plugin_name,
            hook_name,
            timeout,
            waiting,
            plugin_name,
        ),
    )
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
