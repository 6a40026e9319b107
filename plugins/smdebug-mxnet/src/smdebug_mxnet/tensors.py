"""NDArray -> numpy, and reductions where the NDArray lives: only a scalar reaches the host.

On a GPU the reductions are NDArray operators. On the CPU the NDArray's memory is host memory already,
and MXNet's CPU reduction kernels are 20 to 50 times slower than numpy's: there they run in numpy, on a
read-only zero-copy view of that memory (DLPack), so no copy is made for them either.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np


def to_numpy(value: mx.nd.NDArray) -> np.ndarray:
    # asnumpy waits for the value and makes the one host copy the writer keeps
    return value.asnumpy()


class _DLPack:
    """Hands MXNet's DLPack capsule to numpy.from_dlpack (MXNet 1.x predates the __dlpack__ protocol)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, stream=None):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def host_view(value: mx.nd.NDArray) -> np.ndarray:
    """A read-only numpy view of a CPU NDArray's memory, once the writes pending on it are done."""
    if not hasattr(np, "from_dlpack"):  # numpy < 1.22: a copy
        return value.asnumpy()
    return np.from_dlpack(_DLPack(mx.nd.to_dlpack_for_read(value)))


def reduce_on_host(data: np.ndarray, reduction: str):
    if reduction in ("min", "max", "mean", "sum", "prod", "std", "median"):
        return getattr(np, reduction)(data)
    if reduction == "variance":
        return np.var(data)
    if reduction == "l1":
        return np.sum(np.abs(data))
    if reduction == "l2":
        return np.sqrt(np.sum(data * data))
    return None


def reduce_on_device(value: mx.nd.NDArray, reduction: str):
    """The reduction as an NDArray operator on the value's device, or None when MXNet has none (median)."""
    nd = mx.nd
    if reduction in ("min", "max", "mean", "sum", "prod"):
        result = getattr(nd, reduction)(value)
    elif reduction in ("std", "variance"):  # population statistics, as numpy's defaults
        centred = value - nd.mean(value)
        result = nd.mean(centred * centred)
        result = nd.sqrt(result) if reduction == "std" else result
    elif reduction == "l1":
        result = nd.sum(nd.abs(value))
    elif reduction == "l2":
        result = nd.norm(value)
    else:
        return None
    return result.asnumpy().reshape(())[()]  # the one scalar copied to the host


def reduce(value: mx.nd.NDArray, reduction: str, abs: bool):
    """One reduction as a numpy scalar of the value's dtype, or None to let the core compute it."""
    if isinstance(value, mx.np.ndarray):  # the NumPy-compatible arrays: a legacy view for the nd operators
        value = value.as_nd_ndarray()
    if value.stype != "default":
        value = value.tostype("default")
    if value.size == 0:
        return None
    if value.context.device_type == "cpu":
        data = host_view(value)
        return reduce_on_host(np.abs(data) if abs else data, reduction)
    return reduce_on_device(mx.nd.abs(value) if abs else value, reduction)
