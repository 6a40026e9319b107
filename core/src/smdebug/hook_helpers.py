"""Pieces of BaseHook that need none of its state: its never-break-training guard, the walk over a
layer's nested outputs, the constructor's signature, and closing a hook at interpreter exit."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from typing import Any

from smdebug.config import HookConfig
from smdebug.exceptions import StopTraining
from smdebug.store import redact

logger = logging.getLogger("smdebug")


NESTED = (tuple, list, dict)  # what holds a layer's several outputs


class Guard:
    """BaseHook.guard's context manager (a class: entered several times a step, it must cost little)."""

    __slots__ = ("hook", "what")

    def __init__(self, hook, what: str):
        self.hook = hook
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or isinstance(exc, StopTraining) or not isinstance(exc, Exception):
            return False
        hook = self.hook
        hook.warn_once(
            self.what, "smdebug: could not %s at step %d: %s: %s", self.what, hook.step, kind.__name__, exc
        )
        return True


def leaves(value: Any, types: tuple[type, ...]) -> Iterator[Any]:
    """The values of ``types`` in a (nested) tuple, list or dict, in order, or the value itself."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from leaves(item, types)
    elif isinstance(value, dict):
        for item in value.values():
            yield from leaves(item, types)
    elif value is not None and isinstance(value, types):
        yield value


def options_signature(options_class: type[HookConfig]) -> inspect.Signature:
    """The constructor's signature: the options, positional ones first (as from_arguments binds them)."""
    params = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY
            if name in options_class.KEYWORD_ONLY
            else inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=None if field.is_required() else field.get_default(call_default_factory=True),
        )
        for name, field in options_class.model_fields.items()
    ]
    return inspect.Signature(sorted(params, key=lambda p: p.kind))


def close_at_exit(ref, writer) -> None:
    """Interpreter exit: close the hook (flush, collections, end marker), or at least its writer."""
    hook = ref()
    try:
        if hook is not None:
            hook.close()
        elif writer is not None:
            writer.close()
    except Exception as exc:  # never let saving break interpreter exit
        logger.warning("smdebug: could not close at exit: %s: %s", type(exc).__name__, redact(str(exc)))
