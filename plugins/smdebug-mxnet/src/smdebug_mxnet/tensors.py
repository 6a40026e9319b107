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


def _device_op(value: mx.nd.NDArray, reduction: str) -> mx.nd.NDArray | None:
    """The reduction as an NDArray operator on the value's device (asynchronous, one element), or None
    when MXNet has none (median)."""
    nd = mx.nd
    if reduction in ("min", "max", "mean", "sum", "prod"):
        return getattr(nd, reduction)(value)
    if reduction in ("std", "variance"):  # population statistics, as numpy's defaults
        centred = value - nd.mean(value)
        result = nd.mean(centred * centred)
        return nd.sqrt(result) if reduction == "std" else result
    if reduction == "l1":
        return nd.sum(nd.abs(value))
    if reduction == "l2":
        return nd.norm(value)
    return None


def reduce_on_device(value: mx.nd.NDArray, reduction: str):
    """The reduction computed on the value's device, or None when MXNet has none (median)."""
    result = _device_op(value, reduction)
    return None if result is None else result.asnumpy().reshape(())[()]  # the one scalar copied


def on_host(value: mx.nd.NDArray) -> bool:
    """Whether the NDArray's memory is host memory (reduced in numpy there)."""
    return value.context.device_type == "cpu"


def _plain(value) -> mx.nd.NDArray | None:
    """A dense legacy NDArray of the value, or None when it is empty (no reduction is defined)."""
    if isinstance(value, mx.np.ndarray):  # the NumPy-compatible arrays: a legacy view for the nd operators
        value = value.as_nd_ndarray()
    if value.stype != "default":
        value = value.tostype("default")
    return None if value.size == 0 else value


def reduce(value: mx.nd.NDArray, reduction: str, abs: bool):
    """One reduction as a numpy scalar of the value's dtype, or None to let the core compute it."""
    value = _plain(value)
    if value is None:
        return None
    if on_host(value):
        data = host_view(value)
        return reduce_on_host(np.abs(data) if abs else data, reduction)
    return reduce_on_device(mx.nd.abs(value) if abs else value, reduction)


def reductions_on_host(data: np.ndarray, pairs) -> np.ndarray | None:
    """Every (reduction, abs) pair of host data as a 1-d array, or None when their dtypes differ (an
    integer array's mean and min) or one is unknown: the core then stores each in its own dtype."""
    magnitude = np.abs(data) if any(a for _, a in pairs) else None
    results = [reduce_on_host(magnitude if a else data, r) for r, a in pairs]
    if any(r is None for r in results) or len({np.asarray(r).dtype for r in results}) != 1:
        return None
    return np.array(results, dtype=np.asarray(results[0]).dtype)


def reductions_on_device(value: mx.nd.NDArray, pairs) -> mx.nd.NDArray | None:
    """Every (reduction, abs) pair as one 1-d NDArray on the value's device, queued on MXNet's engine
    (nothing waits); None for a median or results of different dtypes (the core reduces one by one)."""
    magnitude = mx.nd.abs(value) if any(a for _, a in pairs) else None
    results = [_device_op(magnitude if a else value, r) for r, a in pairs]
    if any(r is None for r in results) or len({r.dtype for r in results}) != 1:
        return None
    return mx.nd.concat(*(r.reshape((1,)) for r in results), dim=0)


def reductions(value, pairs: list[tuple[str, bool]]):
    """Every (reduction, abs) pair of a value, the same values and dtype as ``reduce``: on the CPU a
    numpy array computed on the zero-copy view (host memory already); elsewhere a 1-d NDArray left on
    the device for to_host. None when the core must reduce it one by one."""
    value = _plain(value)
    if value is None:
        return None
    if on_host(value):
        return reductions_on_host(host_view(value), pairs)
    return reductions_on_device(value, pairs)


def to_host(results: list) -> list[np.ndarray]:
    """The step's reduction results on the host: one concat and one copy per (context, dtype) group of
    NDArrays; numpy results (computed on the CPU) as they are."""
    groups: dict[tuple, list[int]] = {}
    host: list = list(results)
    for i, r in enumerate(results):
        if isinstance(r, mx.nd.NDArray):
            groups.setdefault((r.context, r.dtype), []).append(i)
    for members in groups.values():
        joined = mx.nd.concat(*(results[i] for i in members), dim=0).asnumpy()
        start = 0
        for i in members:
            end = start + results[i].shape[0]
            host[i] = joined[start:end]
            start = end
    return host
