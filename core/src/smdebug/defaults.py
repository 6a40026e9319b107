"""The core's own implementations of its hooks: numpy capture and reductions, the fsspec store."""

from __future__ import annotations

import importlib
import numbers

import numpy as np

from smdebug.hookspecs import hookimpl
from smdebug.reductions import numpy_reduction
from smdebug.store import Store


@hookimpl(trylast=True)
def smdebug_to_numpy(value):
    # A copy: the writer encodes it later, off the training thread, and the caller may change it meanwhile.
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (np.generic, numbers.Number, list, tuple)) or hasattr(value, "__array__"):
        return np.array(value)
    return None


@hookimpl(trylast=True)
def smdebug_reduce(value, reduction, abs):
    if isinstance(value, (np.ndarray, np.generic, numbers.Number)):
        return numpy_reduction(value, reduction, abs)
    from smdebug import plugins

    array = plugins.to_numpy(value)
    return None if array is None else numpy_reduction(array, reduction, abs)


@hookimpl(trylast=True)
def smdebug_open_store(uri):
    return Store(uri)


@hookimpl
def smdebug_add_commands(subparsers):
    from smdebug.cli import COMMAND_MODULES

    for name in COMMAND_MODULES:
        importlib.import_module(name).add_command(subparsers)
