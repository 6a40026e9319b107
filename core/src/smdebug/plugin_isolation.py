"""Isolating a plugin's hook implementations: an implementation (or hook wrapper) that raises is reported
once (naming the plugin and the hook) and its call goes on as if it were not there."""

from __future__ import annotations

import functools
from collections.abc import Callable


def isolate(function: Callable, plugin_name: str, hook_name: str, report: Callable) -> Callable:
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
