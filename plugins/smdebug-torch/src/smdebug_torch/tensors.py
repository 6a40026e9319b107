"""Torch tensors to host numpy arrays, and reductions computed on the tensor's own device."""

from __future__ import annotations

import contextlib
import math
import threading

import numpy as np
import torch

# Dtypes numpy cannot hold (or holds badly): saved as float32 so that any reader can use them.
_UPCAST = {torch.bfloat16}
for _name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if hasattr(torch, _name):
        _UPCAST.add(getattr(torch, _name))
# Reductions are computed in at least float32 (float16 sums overflow quickly).
_LOW_PRECISION = _UPCAST | {torch.float16}


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


def to_numpy(value: torch.Tensor) -> np.ndarray:
    """Copy a tensor to a host array it does not share memory with (the writer encodes it later)."""
    t = _plain(value)
    if t.dtype in _UPCAST:
        t = t.float()  # a new tensor already
        return t.cpu().numpy()
    if t.device.type == "cpu":
        # numpy's copy: single-threaded and cheaper than torch's clone (which may start intra-op threads)
        return t.numpy().copy()
    return t.cpu().numpy()


def _median(t: torch.Tensor) -> torch.Tensor:
    """numpy's median: the mean of the two middle values when the count is even, NaN if any NaN
    (decided on the device: no synchronisation)."""
    flat = t.reshape(-1)
    ordered = torch.sort(flat).values
    n = ordered.numel()
    middle = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    if flat.is_floating_point():
        middle = torch.where(torch.isnan(flat).any(), torch.full_like(middle, math.nan), middle)
    return middle


_REDUCTIONS = {
    "min": torch.min,
    "max": torch.max,
    "median": _median,
    "mean": torch.mean,
    "std": lambda t: torch.std(t, correction=0),  # numpy's default (ddof=0)
    "variance": lambda t: torch.var(t, correction=0),
    "sum": torch.sum,
    "prod": torch.prod,
    # norms of the flattened tensor, whatever its rank
    "l1": lambda t: torch.linalg.vector_norm(t.reshape(-1), 1),
    "l2": lambda t: torch.linalg.vector_norm(t.reshape(-1), 2),
}


def _prepared(value: torch.Tensor) -> torch.Tensor | None:
    """The tensor the reductions are computed on, or None when numpy must compute them on the host."""
    t = _plain(value)
    if t.numel() == 0:
        return None  # undefined: numpy says so (the core then saves no reduction of it)
    if t.dtype in _LOW_PRECISION:
        return t.float()
    if t.is_complex():
        return t.abs()  # complex values have no order: reduced on their magnitude, as numpy_reduction
    if not t.is_floating_point():  # integers and booleans, as numpy computes them
        return t.double()
    return t


class Deferred:
    """A tensor's reductions, computed later together with the other tensors waiting with it (one kernel
    per reduction for the whole group where torch has a foreach kernel). Only where the tensors cannot
    change before the group is computed (see ``deferring``)."""

    __slots__ = ("tensor", "pairs", "result")

    def __init__(self, tensor: torch.Tensor, pairs: tuple):
        self.tensor = tensor
        self.pairs = pairs
        self.result: torch.Tensor | None = None


_defer = threading.local()
_waiting: list[Deferred] = []
_waiting_lock = threading.Lock()
_FOREACH = {
    "l2": lambda ts: torch._foreach_norm(ts, 2),
    "l1": lambda ts: torch._foreach_norm(ts, 1),
}
if hasattr(torch, "_foreach_max"):
    _FOREACH["max"] = torch._foreach_max


@contextlib.contextmanager
def deferring():
    """Within it, reductions started on this thread wait and are computed together when it ends (the
    tensors must not change in between: a model's parameters during its forward pre-hook's loop)."""
    defer(True)
    try:
        yield
    finally:
        defer(False)
        compute_deferred()


def defer(on: bool) -> None:
    """From now on, reductions started on this thread wait for compute_deferred (or to_host)."""
    _defer.on = on


def compute_deferred() -> None:
    """Compute every waiting reduction, grouped by device, dtype and requested reductions."""
    global _waiting
    with _waiting_lock:
        waiting, _waiting = _waiting, []
    groups: dict[tuple, list[Deferred]] = {}
    for d in waiting:
        groups.setdefault((d.tensor.device, d.tensor.dtype, d.pairs), []).append(d)
    for (_, _, pairs), members in groups.items():
        try:
            matrix = _grouped([d.tensor for d in members], pairs)
            for i, d in enumerate(members):
                d.result = matrix[i]
        except (RuntimeError, TypeError, NotImplementedError):
            for d in members:  # e.g. float64 on a device without it: on the host, one by one
                d.result = _together(d.tensor.cpu().double(), pairs)
        for d in members:
            d.tensor = None


def _grouped(ts: list[torch.Tensor], pairs: tuple) -> torch.Tensor:
    """[tensor, pair] results of a group of tensors of one device and dtype."""
    magnitudes = torch._foreach_abs(ts) if any(a for _, a in pairs) else None
    columns = []
    for reduction, absolute in pairs:
        source = magnitudes if absolute else ts
        foreach = _FOREACH.get(reduction)
        if foreach is not None:
            column = foreach(source)
        else:
            fn = _REDUCTIONS[reduction]
            column = [fn(t) for t in source]
        columns.append(torch.stack(column))
    return torch.stack(columns, 1)


def _together(t: torch.Tensor, pairs) -> torch.Tensor:
    magnitude = t.abs() if any(a for _, a in pairs) else None
    return torch.stack([_REDUCTIONS[r](magnitude if a else t).reshape(()) for r, a in pairs])


def reductions(value: torch.Tensor, pairs: list[tuple[str, bool]]) -> torch.Tensor | Deferred | None:
    """Every (reduction, abs) pair of a tensor as one 1-d tensor on its device: nothing is waited for
    (the core brings the step's results to the host together, see to_host). While deferred (``defer``,
    ``deferring``), a Deferred computed later with the other tensors of its group."""
    for reduction, _ in pairs:
        if reduction not in _REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}: choose from {', '.join(_REDUCTIONS)}")
    t = _prepared(value)
    if t is None:
        return None
    if getattr(_defer, "on", False):
        d = Deferred(t, tuple(pairs))
        with _waiting_lock:
            _waiting.append(d)
        return d
    try:
        magnitude = t.abs() if any(a for _, a in pairs) else None
        return torch.stack([_REDUCTIONS[r](magnitude if a else t).reshape(()) for r, a in pairs])
    except (RuntimeError, TypeError, NotImplementedError):
        return None  # e.g. float64 on a device without it: numpy computes it on the host


def to_host(results: list) -> list[np.ndarray] | None:
    """The step's reduction results on the host, one transfer per (device, dtype) group."""
    if any(isinstance(r, Deferred) for r in results):
        compute_deferred()
        results = [r.result if isinstance(r, Deferred) else r for r in results]
    if not all(isinstance(r, torch.Tensor) for r in results):
        return None
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(results):
        groups.setdefault((r.device, r.dtype), []).append(i)
    host: list = [None] * len(results)
    for members in groups.values():
        joined = torch.cat([results[i] for i in members]).cpu().numpy()
        start = 0
        for i in members:
            end = start + results[i].numel()
            host[i] = joined[start:end]
            start = end
    return host


def reduce(value: torch.Tensor, reduction: str, abs: bool = False) -> np.floating | None:
    """One reduction computed where the tensor lives; only the resulting scalar reaches the host.

    Returns None when torch cannot compute it here (the core then falls back to numpy).
    """
    fn = _REDUCTIONS.get(reduction)
    if fn is None:
        raise ValueError(f"unknown reduction {reduction!r}: choose from {', '.join(_REDUCTIONS)}")
    t = _prepared(value)
    if t is None:
        return None
    try:
        # a numpy scalar of the result's dtype: the core stores the reduction in it, as smdebug 1.0 does
        return fn(t.abs() if abs else t).cpu().numpy()[()]
    except (RuntimeError, TypeError, NotImplementedError):
        return None  # e.g. float64 on a device without it: numpy computes it on the host
