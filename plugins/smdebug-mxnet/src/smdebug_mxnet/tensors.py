"""NDArray -> numpy, and reductions where the NDArray lives: only a scalar reaches the host.

On a GPU the reductions are NDArray operators. On the CPU the NDArray's memory is host memory already,
and MXNet's CPU reduction kernels are 20 to 50 times slower than numpy's: there they run in numpy, on a
read-only zero-copy view of that memory (DLPack), so no copy is made for them either. A step's small float
tensors are reduced together: one concatenation (in float64) and one numpy call per reduction for all of
them (segment reductions), instead of a few numpy calls per tensor.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np
from mxnet.ndarray import NDArray

# CPU float tensors up to this many elements are reduced together with the step's others of their dtype;
# larger ones alone, on their own view (their numpy work outweighs the calls, and joining would copy them:
# with the small CNN's two 50k-element tensors joined too, a step's reductions took 6x longer).
JOIN_ELEMENTS = 4096
_JOINED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


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
    try:
        return np.from_dlpack(_DLPack(mx.nd.to_dlpack_for_read(value)))
    except mx.base.MXNetError:
        # kept in an MKL-DNN layout (a convolution's weight after an inference forward): no plain view
        # of it exists; asnumpy reorders it into a copy
        return value.asnumpy()


def host_memory(value: mx.nd.NDArray) -> np.ndarray | None:
    """A view of a dense CPU NDArray's memory for the writer to copy at once (asnumpy's copy saved),
    else None."""
    if type(value) is NDArray and value.stype == "default" and on_host(value) and 0 not in value.shape:
        return host_view(value)
    return None


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
    if type(value) is not NDArray:  # each test is a call into MXNet: only for the other kinds
        if isinstance(value, mx.np.ndarray):  # NumPy-compatible arrays: a legacy view for the nd operators
            value = value.as_nd_ndarray()
        if value.stype != "default":
            value = value.tostype("default")
    return None if 0 in value.shape else value


def reduce(value: mx.nd.NDArray, reduction: str, abs: bool):
    """One reduction as a numpy scalar of the value's dtype, or None to let the core compute it."""
    value = _plain(value)
    if value is None:
        return None
    if on_host(value):
        data = host_view(value)
        if _joinable(data):  # the batched path's own computation: the same values
            rows = _joined([data], [(reduction, abs)], data.dtype)
            if rows is not None:
                return rows[0][0]
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


def _segment_table(flat: np.ndarray, sizes: np.ndarray, pairs) -> np.ndarray | None:
    """Every (reduction, abs) pair of each segment of a flat float64 array (segments of ``sizes``
    elements, one after another): a (segments, pairs) float64 table, or None for an unknown reduction.
    Each is one ufunc.reduceat over all segments; a segment's result does not depend on its neighbours."""
    starts = np.zeros(len(sizes), dtype=np.intp)
    np.cumsum(sizes[:-1], out=starts[1:])
    magnitude = np.abs(flat) if any(a or r == "l1" for r, a in pairs) else None
    known: dict = {}

    def total(data, key):  # data: an array, or a function making it (only when not known yet)
        if key not in known:
            known[key] = np.add.reduceat(data() if callable(data) else data, starts)
        return known[key]

    columns = []
    for reduction, absolute in pairs:
        data = magnitude if absolute else flat
        if reduction == "sum":
            column = total(data, ("sum", absolute))
        elif reduction == "mean":
            column = total(data, ("sum", absolute)) / sizes
        elif reduction == "min":
            column = np.minimum.reduceat(data, starts)
        elif reduction == "max":
            column = np.maximum.reduceat(data, starts)
        elif reduction == "prod":
            column = np.multiply.reduceat(data, starts)
        elif reduction in ("variance", "std"):  # population statistics, as numpy's defaults
            centred = data - np.repeat(total(data, ("sum", absolute)) / sizes, sizes)
            column = np.add.reduceat(centred * centred, starts) / sizes
            column = np.sqrt(column) if reduction == "std" else column
        elif reduction == "l1":
            column = total(magnitude, ("sum", True))
        elif reduction == "l2":
            column = np.sqrt(total(lambda: flat * flat, "squares"))
        elif reduction == "median":  # no segment form: one call per tensor
            column = np.array([np.median(data[s : s + n]) for s, n in zip(starts, sizes)])
        else:
            return None
        columns.append(column)
    return np.stack(columns, axis=1)


def _joined(views: list[np.ndarray], pairs, dtype) -> list[np.ndarray] | None:
    """Every pair of each small host float array, reduced together: one 1-d row of ``dtype`` each."""
    sizes = np.array([v.size for v in views], dtype=np.intp)
    flat = np.empty(int(sizes.sum()), dtype=np.float64)  # accumulated in float64: exact to the dtype
    np.concatenate([v.reshape(-1) for v in views], out=flat)
    table = _segment_table(flat, sizes, pairs)
    if table is None:
        return None
    return list(table.astype(dtype))


def _joinable(data: np.ndarray) -> bool:
    return data.dtype in _JOINED_DTYPES and data.size <= JOIN_ELEMENTS


def reductions(values: list, pairs: list[tuple[str, bool]]) -> list:
    """Every (reduction, abs) pair of each value, one 1-d result per value (None: the core reduces that
    one one by one). On the CPU numpy arrays computed on the zero-copy views (host memory already), the
    small float ones of a dtype together; elsewhere a 1-d NDArray left on the device for to_host."""
    results: list = [None] * len(values)
    joined: dict = {}  # dtype -> (indices, views)
    for i, value in enumerate(values):
        if not isinstance(value, mx.nd.NDArray):
            continue  # not ours
        try:
            value = _plain(value)
            if value is None:
                continue
            if not on_host(value):
                results[i] = reductions_on_device(value, pairs)
                continue
            data = host_view(value)
            if _joinable(data):
                indices, views = joined.setdefault(data.dtype, ([], []))
                indices.append(i)
                views.append(data)
            else:
                results[i] = reductions_on_host(data, pairs)
        except Exception:  # this value only: the core reduces it one by one, and says why if it fails
            results[i] = None
    for dtype, (indices, views) in joined.items():
        rows = _joined(views, pairs, dtype)
        if rows is not None:
            for i, row in zip(indices, rows):
                results[i] = row
    return results


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
