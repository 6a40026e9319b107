"""Torch tensors to host numpy arrays, and reductions computed on the tensor's own device."""

from __future__ import annotations

import math

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


def reductions(value: torch.Tensor, pairs: list[tuple[str, bool]]) -> torch.Tensor | None:
    """Every (reduction, abs) pair of a tensor as one 1-d tensor on its device: nothing is waited for
    (the core brings the step's results to the host together, see to_host)."""
    for reduction, _ in pairs:
        if reduction not in _REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}: choose from {', '.join(_REDUCTIONS)}")
    t = _prepared(value)
    if t is None:
        return None
    try:
        magnitude = t.abs() if any(a for _, a in pairs) else None
        return torch.stack([_REDUCTIONS[r](magnitude if a else t).reshape(()) for r, a in pairs])
    except (RuntimeError, TypeError, NotImplementedError):
        return None  # e.g. float64 on a device without it: numpy computes it on the host


def to_host(results: list) -> list[np.ndarray] | None:
    """The step's reduction results on the host, one transfer per (device, dtype) group."""
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
