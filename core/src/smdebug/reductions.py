"""Reductions computed with numpy (the core's fallback) and the names reductions are stored under."""

from __future__ import annotations

import re

import numpy as np

REDUCTIONS_PREFIX = "smdebug/reductions/"
ALLOWED_REDUCTIONS = ("min", "max", "median", "mean", "std", "variance", "sum", "prod")
ALLOWED_NORMS = ("l1", "l2")

_NUMPY = {
    "min": np.min,
    "max": np.max,
    "median": np.median,
    "mean": np.mean,
    "std": np.std,
    "variance": np.var,
    "sum": np.sum,
    "prod": np.prod,
    # Norms of the flattened tensor (what torch.norm computes), whatever the tensor's rank.
    "l1": lambda a: np.sum(np.abs(a)),
    "l2": lambda a: np.sqrt(np.sum(np.square(np.abs(a)))),
}


def numpy_reduction(array, reduction: str, abs: bool = False) -> float:
    """One reduction of an array as a float; a complex array is reduced on its magnitude."""
    if reduction not in _NUMPY:
        from smdebug.exceptions import SMDebugValueError, did_you_mean

        raise SMDebugValueError(  # (smdebug 1.0 raises its SMDebugValueError, a ValueError, too)
            f"unknown reduction {reduction!r}{did_you_mean(reduction, _NUMPY)}: choose from {', '.join(_NUMPY)}"
        )
    array = np.asarray(array)
    if array.dtype.kind == "b":
        array = array.astype(np.int64)
    elif array.dtype.kind not in "iufc":
        raise TypeError(f"cannot compute {reduction} of a {array.dtype} tensor")
    if array.size == 0:
        raise ValueError(f"cannot compute {reduction} of an empty tensor")
    if abs or array.dtype.kind == "c":  # complex values have no order: reduced on their magnitude |z|
        array = np.abs(array)
    if array.dtype.kind == "f" and array.dtype.itemsize < 4:
        array = array.astype(np.float32)  # float16 sums overflow quickly
    return float(_NUMPY[reduction](array))


def reduction_tensor_name(tensor_name: str, reduction: str, abs: bool, keep_index: bool = False) -> str:
    """smdebug's stored name, e.g. ``smdebug/reductions/abs_mean/gradient/fc.weight``; a TF graph
    tensor's output index (``:0``) is dropped unless ``keep_index`` (smdebug 1.0's TF hooks keep it)."""
    name = tensor_name if keep_index else re.sub(r":\d+", "", tensor_name)
    return f"{REDUCTIONS_PREFIX}{'abs_' if abs else ''}{reduction}/{name}"


def parse_reduction_tensor_name(name: str) -> tuple[str, str, bool] | None:
    """(tensor name, reduction, abs) for a stored reduction name, None for any other name."""
    if not name.startswith(REDUCTIONS_PREFIX):
        return None
    reduction, _, tensor = name[len(REDUCTIONS_PREFIX) :].partition("/")
    absolute = reduction.startswith("abs_")
    return tensor, reduction[4:] if absolute else reduction, absolute
