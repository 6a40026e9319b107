"""Torch tensors to host numpy arrays, and reductions computed on the tensor's own device (plain CPU
float tensors by the native kernel once it is loaded: smdebug_torch.native)."""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import numpy as np
import torch

from smdebug_torch import native

# Dtypes numpy cannot hold (or holds badly): saved as float32 so that any reader can use them.
_UPCAST = {torch.bfloat16}
for _name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if hasattr(torch, _name):
        _UPCAST.add(getattr(torch, _name))
# Reductions are computed in at least float32 (float16 sums overflow quickly).
_LOW_PRECISION = _UPCAST | {torch.float16}


_functorch_level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level", None)
_no_functorch = getattr(torch._C, "_DisableFuncTorch", None)


def _outside_transforms(fn):
    """``fn`` run outside torch.func's transforms (vmap, grad): a step can end inside one (a model's forward
    under ``functional_call`` starts the next step), where every result is a transform's wrapper, without
    storage to read (the step's one host transfer failed, and its reductions with it)."""
    if _functorch_level is None or _no_functorch is None:
        return fn

    @functools.wraps(fn)
    def run(*args):
        if _functorch_level() is None:
            return fn(*args)
        with _no_functorch():
            return fn(*args)

    return run


def _plain(value: torch.Tensor) -> torch.Tensor:
    """A detached, dense, plain tensor with the same values."""
    t = value.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_quantized:
        t = t.dequantize()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def is_wrapper(value: torch.Tensor) -> bool:
    """A tensor subclass that dispatches torch's operations itself (DTensor, FakeTensor...): its values
    are not in memory of its own; torch neither copies it to the host nor reduces it with plain tensors
    (a DTensor parameter or gradient goes through smdebug_torch.sharded instead)."""
    return type(value).__torch_dispatch__ is not _PLAIN_DISPATCH


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__
_META = torch.device("meta")


def has_no_values(value: torch.Tensor) -> bool:
    """A tensor whose values cannot be brought to the host as one array: a wrapper subclass, a tensor on
    the meta device (no data) or a nested tensor (no single shape)."""
    return value.is_meta or value.is_nested or is_wrapper(value)


@_outside_transforms
def to_numpy(value: torch.Tensor) -> np.ndarray | None:
    """Copy a tensor to a host array it does not share memory with (the writer encodes it later); None
    for a tensor without values of its own (the core then records it as not captured, saying why)."""
    if has_no_values(value):
        return None
    t = _plain(value)
    if t.dtype == torch.complex32:  # numpy has no complex32
        return t.to(torch.complex64).cpu().numpy()
    if t.dtype in _UPCAST:
        t = t.float()  # a new tensor already
        return t.cpu().numpy()
    if t.is_cpu:
        # numpy's copy: single-threaded and cheaper than torch's clone (which may start intra-op threads)
        return t.numpy().copy()
    return t.cpu().numpy()


_PLAIN_FLOATS = frozenset({torch.float32, torch.float64})


def host_view(value: torch.Tensor) -> np.ndarray | None:
    """A numpy view of a plain CPU float tensor's memory (the writer copies it at once), else None."""
    if value.dtype in _PLAIN_FLOATS and value.layout == torch.strided and value.is_cpu:
        if not value.is_neg():  # (a negative view: its memory holds the opposite values)
            try:
                return value.detach().numpy()
            except RuntimeError:  # a tensor subclass with no memory of its own: to_numpy says why
                return None
    return None


def _prepared(value: torch.Tensor) -> torch.Tensor | None:
    """The tensor the reductions are computed on, or None when numpy must compute them on the host."""
    if value.dtype in _PLAIN_FLOATS and value.layout == torch.strided:
        # the common case, cheaply (torch ops honour a negative view's bit; reductions run under no_grad)
        return value if value.numel() else None
    t = _plain(value)
    if t.numel() == 0:
        return None  # undefined: numpy says so (the core then saves no reduction of it)
    if t.is_complex():
        t = t.abs()  # complex values have no order: reduced on their magnitude, as numpy_reduction
    if t.dtype in _LOW_PRECISION:
        return t.float()
    if not t.is_floating_point():  # integers and booleans, as numpy computes them
        return t.double()
    return t


# Tensors up to this size are stacked with others of their shape, so that one kernel per reduction
# reduces them all; a stack holds at most STACK_ELEMENTS (larger tensors are reduced alone).
STACK_NUMEL = 1 << 16
STACK_ELEMENTS = 1 << 22


class Row:
    """A tensor's results: row ``index`` of a [tensors, reductions] matrix computed for its group."""

    __slots__ = ("matrix", "index")

    def __init__(self, matrix: torch.Tensor, index: int):
        self.matrix = matrix
        self.index = index


def _median_rows(m: torch.Tensor) -> torch.Tensor:
    """numpy's median of each row: the mean of the two middle values when the count is even, NaN if any
    NaN (decided on the device: no synchronisation)."""
    ordered = torch.sort(m, dim=1).values
    n = m.shape[1]
    middle = ordered[:, n // 2] if n % 2 else (ordered[:, n // 2 - 1] + ordered[:, n // 2]) / 2
    if m.is_floating_point():
        middle = torch.where(torch.isnan(m).any(1), torch.full_like(middle, math.nan), middle)
    return middle


# each reduction of every row of a [tensors, elements] matrix
_ROW_REDUCTIONS = {
    "min": lambda m: m.amin(1),
    "max": lambda m: m.amax(1),
    "median": _median_rows,
    "mean": lambda m: m.mean(1),
    "std": lambda m: m.std(1, correction=0),  # numpy's default (ddof=0)
    "variance": lambda m: m.var(1, correction=0),
    "sum": lambda m: m.sum(1),
    "prod": lambda m: m.prod(1),
    "l1": lambda m: torch.linalg.vector_norm(m, 1, dim=1),
    "l2": lambda m: torch.linalg.vector_norm(m, 2, dim=1),
}


def _reduce_rows(m: torch.Tensor, pairs: list[tuple[str, bool]]) -> torch.Tensor:
    magnitude = m.abs() if any(a for _, a in pairs) else None
    return torch.stack([_ROW_REDUCTIONS[r](magnitude if a else m) for r, a in pairs], 1)


@_outside_transforms
def reductions(values: list, pairs: list[tuple[str, bool]]) -> list[Row | None]:
    """Every (reduction, abs) pair of each tensor, computed together on the tensors' devices without
    waiting for them: non-empty plain CPU float32 (or float64) tensors by the native kernel in one call
    (but median and prod); else tensors of one device, dtype and shape are stacked and reduced by one
    kernel per reduction. None for a value torch does not reduce (the core then reduces it with numpy)."""
    # the kernel records nothing for autograd: called outside no_grad, whose switch costs it ~10 µs a call
    found = _native(values, pairs)  # (an unknown reduction has no kernel code: it is refused below)
    if found is not None:
        return found
    for reduction, _ in pairs:
        if reduction not in _ROW_REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}: choose from {', '.join(_ROW_REDUCTIONS)}")
    with torch.no_grad():
        return _torch_reductions(values, pairs)


# The grouping of a list of plain float tensors (by their shapes, dtypes and devices) is kept, so that a
# step's reductions, the same tensors' every step, make no Python call per tensor (a few hundred cost a
# many-tensor model more than its kernels); host stacks keep their buffers. At most PLANS are kept.
PLANS = 16
_plans: dict[tuple, _Plan] = {}
_PLAIN_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_shape_of = operator.attrgetter("shape")
_dtype_of = operator.attrgetter("dtype")
_device_of = operator.attrgetter("device")
_layout_of = operator.attrgetter("layout")


class _Plan:
    """The groups of one list of tensors (the indices of each stack and of the tensors reduced alone)."""

    def __init__(self, values: list[torch.Tensor], pairs: list[tuple[str, bool]]):
        self.stacks: list[tuple[list[int], Any, torch.Tensor | None]] = []  # (indices, picker, buffer)
        self.alone: list[tuple[list[int], Any]] = []
        for members, stacked in _groups(values):
            pick = operator.itemgetter(*members)
            if stacked:
                first = values[members[0]]
                # a buffer kept on the host only: an accelerator's memory is not held between steps
                buffer = None
                if first.device.type == "cpu":
                    buffer = torch.empty((len(members), *first.shape), dtype=first.dtype)
                self.stacks.append((members, pick, buffer))
            else:
                self.alone.append((members, pick))
        self.count = len(values)

    def run(self, values: list[torch.Tensor], pairs: list[tuple[str, bool]]) -> list[Row | None]:
        results: list[Row | None] = [None] * self.count
        for members, pick, buffer in self.stacks:
            try:
                stacked = torch.stack(_listed(pick(values)), out=buffer)
                matrix = _reduce_rows(stacked.view(len(members), -1), pairs)
            except (RuntimeError, TypeError, NotImplementedError):
                continue  # numpy computes these on the host
            for row, i in enumerate(members):
                results[i] = Row(matrix, row)
        for members, pick in self.alone:
            _fill(results, list(zip(members, _listed(pick(values)))), _reduce_each, pairs)
        return results


def _listed(picked) -> list:
    return list(picked) if isinstance(picked, tuple) else [picked]


def _groups(values: list) -> list[tuple[list[int], bool]]:
    """The indices of tensors stacked together (True) and of tensors reduced alone, by device and dtype."""
    shapes: dict = {}  # (device, dtype, shape) -> indices of small tensors
    for i, t in enumerate(values):
        numel = t.numel()
        if numel:
            shapes.setdefault((t.device, t.dtype, t.shape if numel <= STACK_NUMEL else i), []).append(i)
    groups: list[tuple[list[int], bool]] = []
    alone: dict = {}  # (device, dtype) -> indices of tensors without a partner of their shape
    for key, members in shapes.items():
        if len(members) == 1:
            alone.setdefault(key[:2], []).extend(members)
            continue
        per_stack = max(1, STACK_ELEMENTS // values[members[0]].numel())
        groups += [(members[first : first + per_stack], True) for first in range(0, len(members), per_stack)]
    return groups + [(members, False) for members in alone.values()]


# The native kernel's code of each (reduction, abs) pair it computes (median and prod: torch's calls).
_CODES = {(r, a): 2 * i + a for i, r in enumerate(native.REDUCTIONS) for a in (False, True)}
_HOST_DTYPES = {32: np.dtype(np.float32), 64: np.dtype(np.float64)}


class HostRow:
    """A tensor's results computed by the native kernel: row ``index`` of a batch's host matrix."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: _Batch, index: int):
        self.batch = batch
        self.index = index


class _Batch:
    """A [tensors, reductions] float64 host matrix the native kernel fills, and a HostRow of each row:
    kept for lists of the same length and reductions (a few: a step's weights and gradients may be
    two such lists), and filled again once to_host has copied it (one still pending is left to its
    rows)."""

    __slots__ = ("codes", "out", "host", "rows", "dtype", "pending", "call")

    def __init__(self, count: int, codes: list[int]):
        self.codes = codes
        self.out = torch.empty(count, len(codes), dtype=torch.float64)
        array = np.array(codes, dtype=np.int64)  # (kept by the call's arguments)
        # the list reducer's arguments after the values: codes, their count, the matrix, its rows
        self.call = (array, array.ctypes.data, len(codes), self.out.data_ptr(), count)
        self.host = self.out.numpy()
        self.rows = [HostRow(self, i) for i in range(count)]
        self.dtype = _HOST_DTYPES[64]  # the reductions' dtype: their tensors'
        self.pending = False


_batches: dict[tuple, list[_Batch]] = {}
BATCHES = 4  # kept of one length and reductions


def _native(values: list, pairs: list[tuple[str, bool]]) -> list[HostRow] | None:
    """The reductions of a list of non-empty plain CPU float32 (or float64) tensors by the native kernel,
    in one call and one reading of each tensor; None when it is not loaded or does not take them."""
    reduce = native.reducer()
    if reduce is None:
        return None
    key = (len(values), *pairs)
    kept = _batches.get(key, ())
    for batch in kept:
        if not batch.pending:
            break
    else:
        codes = [_CODES.get(pair) for pair in pairs]
        if not values or None in codes:
            return None
        batch = _Batch(len(values), codes)
        if not kept:
            if len(_batches) >= PLANS:
                _batches.clear()
            kept = _batches[key] = []
        if len(kept) < BATCHES:
            kept.append(batch)
    batch.pending = True  # (at once: the op runs without the GIL, another thread takes another batch)
    fast = native.list_reducer()
    _, codes, count, out, rows = batch.call
    bits = fast(values, codes, count, out, rows) if fast is not None else 0
    if not bits:  # (the op takes what the list reducer leaves, or refuses it too)
        try:
            bits = reduce(values, batch.codes, batch.out)
        except (RuntimeError, TypeError):  # e.g. a value that is not a tensor: torch's calls say
            bits = 0
    if not bits:
        batch.pending = False
        return None
    batch.dtype = _HOST_DTYPES[bits]
    return batch.rows[:]


def _torch_reductions(values: list, pairs: list[tuple[str, bool]]) -> list[Row | None]:
    dtypes = tuple(map(_dtype_of, values)) if _PLAIN_TYPES.issuperset(map(type, values)) else None
    if dtypes and _PLAIN_FLOATS.issuperset(dtypes) and set(map(_layout_of, values)) == {torch.strided}:
        devices = tuple(map(_device_of, values))
        try:
            key = (tuple(pairs), dtypes, tuple(map(_shape_of, values)), devices)
        except RuntimeError:  # a nested tensor has no shape: the path below leaves it to the core
            key = None
        plan = _plans.get(key)
        # (a meta tensor's results could not reach the host: the path below leaves it to the core)
        if plan is None and key is not None and _META not in devices:
            if len(_plans) >= PLANS:
                _plans.clear()
            plan = _plans[key] = _Plan(values, pairs)
        if plan is not None:
            return plan.run(values, pairs)
    present = [
        (i, t)
        for i, v in enumerate(values)
        if isinstance(v, torch.Tensor) and not has_no_values(v)  # (no values to reduce here)
        for t in [_prepared(v)]
        if t is not None
    ]
    results: list[Row | None] = [None] * len(values)
    for members, stacked in _groups([t for _, t in present]):
        _fill(results, [present[j] for j in members], _stacked if stacked else _reduce_each, pairs)
    return results


def _stacked(ts: list[torch.Tensor], pairs: list[tuple[str, bool]]) -> torch.Tensor:
    return _reduce_rows(torch.stack(ts).reshape(len(ts), -1), pairs)


def _fill(results: list, members: list, compute, pairs) -> None:
    """Each member's Row of the matrix ``compute`` gives for their tensors."""
    try:
        matrix = compute([t for _, t in members], pairs)
    except (RuntimeError, TypeError, NotImplementedError):
        return  # e.g. float64 on a device without it: numpy computes these on the host
    for row, (i, _) in enumerate(members):
        results[i] = Row(matrix, row)


_FOREACH = {"l2": lambda ts: torch._foreach_norm(ts, 2), "l1": lambda ts: torch._foreach_norm(ts, 1)}
if hasattr(torch, "_foreach_max"):
    _FOREACH["max"] = torch._foreach_max


# each reduction of a whole tensor: one torch call, a 0-d result (as smdebug 1.0 reduces a tensor)
_WHOLE_REDUCTIONS = {
    "min": torch.amin,
    "max": torch.amax,
    "median": lambda t: _median_rows(t.reshape(1, -1))[0],
    "mean": torch.mean,
    "std": lambda t: t.std(correction=0),
    "variance": lambda t: t.var(correction=0),
    "sum": torch.sum,
    "prod": torch.prod,
    "l1": lambda t: torch.linalg.vector_norm(t, 1),
    "l2": lambda t: torch.linalg.vector_norm(t, 2),
}


def _reduce_each(ts: list[torch.Tensor], pairs: list[tuple[str, bool]]) -> torch.Tensor:
    """[tensor, pair] results of tensors of different shapes (one device and dtype): one foreach kernel
    for all of them where torch has one, else one kernel per tensor; then one stack of all the 0-d
    results (each torch call costs microseconds on the CPU: a step's reductions are a few dozen of them,
    not hundreds). A mean is a sum divided by the count, as torch's CPU mean computes it (its own call
    costs three times a sum's), the counts divided together."""
    magnitudes = torch._foreach_abs(ts) if any(a for _, a in pairs) else None
    results: list[torch.Tensor] = []
    means = []
    for k, (reduction, absolute) in enumerate(pairs):
        source = magnitudes if absolute else ts
        foreach = _FOREACH.get(reduction)
        if foreach is not None:
            results += foreach(source)
        elif reduction == "mean" and ts[0].device.type == "cpu":
            results += [t.sum() for t in source]
            means.append(k)
        else:
            results += [_WHOLE_REDUCTIONS[reduction](t) for t in source]
    matrix = torch.stack(results).view(len(pairs), len(ts))
    if means:
        counts = torch.tensor([t.numel() for t in ts], dtype=matrix.dtype)
        for k in means:
            matrix[k].div_(counts)
    return matrix.t()


_matrix_of = operator.attrgetter("matrix")
_index_of = operator.attrgetter("index")


@_outside_transforms
def to_host(results: list) -> list[np.ndarray] | np.ndarray | None:
    """The step's results on the host: one transfer per device and dtype for all of them. When all
    have the same device, dtype and reductions, a [results, reductions] array (its rows are the results)."""
    if results and type(results[0]) is HostRow:
        joined = _batches_joined(results)
        if joined is not None:
            return joined
    kinds = set(map(type, results))
    if kinds == {Row}:
        return _rows_to_host(results)
    if not kinds <= {Row, HostRow}:
        return None
    host: list = [None] * len(results)  # a mixture (or rows taken apart): each result's own row
    device = [k for k, r in enumerate(results) if type(r) is Row]
    if device:
        for k, row in zip(device, _rows_to_host([results[k] for k in device])):
            host[k] = row
    for k, r in enumerate(results):
        if type(r) is HostRow:
            host[k] = r.batch.host[r.index].astype(r.batch.dtype)
            r.batch.pending = False
    return host


def _batches_joined(results: list) -> np.ndarray | None:
    """The results as one host array (a copy: the batches are free to be filled again) when they are
    whole batches of native rows, in order, of one dtype and one list of reductions (a step's common
    case); else None."""
    batches, start, total = [], 0, len(results)
    dtype, codes = results[0].batch.dtype, results[0].batch.codes
    while start < total:
        first = results[start]
        if type(first) is not HostRow or first.batch.dtype is not dtype or first.batch.codes != codes:
            return None
        rows = first.batch.rows
        if first is not rows[0] or results[start : start + len(rows)] != rows:
            return None
        batches.append(first.batch)
        start += len(rows)
    # (one numpy call: cold, as at a step's end, each costs microseconds)
    joined = (
        batches[0].host.astype(dtype)
        if len(batches) == 1
        else np.concatenate([b.host for b in batches], dtype=dtype)
    )
    for b in batches:
        b.pending = False
    return joined


def _rows_to_host(results: list) -> list[np.ndarray] | np.ndarray:
    """to_host of device rows (Row) alone."""
    found = list(map(_matrix_of, results))
    matrices = dict(zip(map(id, found), found))  # each matrix once, in order
    if len({(m.device, m.dtype, m.shape[1]) for m in matrices.values()}) == 1:
        # one [rows, reductions] array of all the matrices: pick the results' rows from it, in their order
        first, start = {}, 0
        for key, m in matrices.items():
            first[key] = start
            start += m.shape[0]
        rows = torch.cat(list(matrices.values())).cpu().numpy()
        where = map(operator.add, map(first.__getitem__, map(id, found)), map(_index_of, results))
        return rows[np.fromiter(where, dtype=np.intp, count=len(results))]
    groups: dict[tuple, list[torch.Tensor]] = {}
    for m in matrices.values():
        groups.setdefault((m.device, m.dtype), []).append(m)
    host: dict[int, np.ndarray] = {}
    for members in groups.values():
        joined = torch.cat([m.reshape(-1) for m in members]).cpu().numpy()
        start = 0
        for m in members:
            host[id(m)] = joined[start : start + m.numel()].reshape(m.shape)
            start += m.numel()
    return [host[id(m)][r.index] for m, r in zip(found, results)]


def reduce(value: torch.Tensor, reduction: str, abs: bool = False) -> np.floating | None:
    """One reduction computed where the tensor lives (a batch of one); only the resulting scalar reaches
    the host, a numpy scalar of the result's dtype (the core stores the reduction in it, as smdebug 1.0).

    Returns None when torch cannot compute it here (the core then falls back to numpy).
    """
    (result,) = reductions([value], [(reduction, abs)])
    return None if result is None else to_host([result])[0][0]
