"""NDArray -> numpy, and reductions computed on the NDArray's device (only a scalar reaches the host)."""

from __future__ import annotations

import mxnet as mx
import numpy as np


def to_numpy(value: mx.nd.NDArray) -> np.ndarray:
    # asnumpy waits for the value and makes the one host copy the writer keeps
    return value.asnumpy()


def _reduced(value: mx.nd.NDArray, reduction: str) -> mx.nd.NDArray | None:
    nd = mx.nd
    if reduction in ("min", "max", "mean", "sum", "prod"):
        return getattr(nd, reduction)(value)
    if reduction in ("std", "variance"):  # population statistics, as numpy's defaults
        centred = value - nd.mean(value)
        variance = nd.mean(centred * centred)
        return nd.sqrt(variance) if reduction == "std" else variance
    if reduction == "l1":
        return nd.sum(nd.abs(value))
    if reduction == "l2":
        return nd.norm(value)
    return None  # median: the core computes it from the host copy


def reduce(value: mx.nd.NDArray, reduction: str, abs: bool):
    """One reduction as a numpy scalar of the value's dtype, or None when MXNet has no operator for it."""
    if isinstance(value, mx.np.ndarray):  # the NumPy-compatible arrays: a legacy view for the nd operators
        value = value.as_nd_ndarray()
    if value.stype != "default":
        value = value.tostype("default")
    if value.size == 0:
        return None
    if abs:
        value = mx.nd.abs(value)
    result = _reduced(value, reduction)
    if result is None:
        return None
    return result.asnumpy().reshape(())[()]
