"""The native kernel's reductions and partial statistics of lists of tensors (smdebug_torch.native),
against numpy's in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smdebug_torch import native


@pytest.fixture(scope="module")
def loaded():
    if not native.wait(timeout=600):
        pytest.skip("the native kernel could not be built here (no C++ compiler?)")


def some_tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [
        torch.randn(70, 33, generator=g),
        torch.randn(9, 7, generator=g).t(),  # strided
        torch.tensor(-2.5),
        torch.tensor([1.0, float("nan"), -3.0]),
        torch.tensor([float("-inf"), 2.0]),
        torch.tensor([float("inf"), float("-inf"), 1.0]),
        torch.full((4,), -3e30),  # squares overflow float32
        torch.randn(5000, generator=g).index_fill_(0, torch.tensor([4321]), float("nan")),
        torch.randn(9000, generator=g) * 1e25,
        torch.randn(20000, generator=g) * 0.01 + 1e3,  # a large mean beside a small spread
        torch.randn(33, generator=g).double(),
    ]


NUMPY = {
    "min": np.min,
    "max": np.max,
    "mean": np.mean,
    "std": np.std,
    "variance": np.var,
    "sum": np.sum,
    "l1": lambda a: np.sum(np.abs(a)),
    "l2": lambda a: np.sqrt(np.sum(a * a)),
}


def numpy_of(t: torch.Tensor, reduction: str, absolute: bool) -> float:
    a = t.double().numpy()
    with np.errstate(all="ignore"):
        return float(NUMPY[reduction](np.abs(a) if absolute else a))


def test_reduce_writes_every_reduction_of_each_tensor_as_numpy_computes_it(loaded):
    codes = list(range(2 * len(native.REDUCTIONS)))
    for dtype, bits in ((torch.float32, 32), (torch.float64, 64)):
        tensors = [t.to(dtype) for t in some_tensors()]
        out = torch.empty(len(tensors), len(codes), dtype=torch.float64)
        assert native.reducer()(tensors, codes, out) == bits
        for t, row in zip(tensors, out.tolist()):
            want = [numpy_of(t, native.REDUCTIONS[c // 2], bool(c % 2)) for c in codes]
            assert row == pytest.approx(want, rel=1e-9 if bits == 64 else 2e-6, nan_ok=True), t


@pytest.mark.parametrize(
    "made",
    [
        lambda: [torch.ones(2), torch.ones(0)],  # an empty tensor: undefined, left to the other path
        lambda: [torch.ones(2), torch.ones(2, dtype=torch.float64)],  # two dtypes
        lambda: [torch.ones(2, dtype=torch.float16)],
        lambda: [torch.ones(2, dtype=torch.int64)],
        lambda: [torch.ones(2)._neg_view()],  # its memory holds the opposite values
        lambda: [torch.ones(2, device="meta")],
        lambda: [torch.ones(2).to_sparse()],
    ],
    ids=["empty", "mixed", "float16", "int64", "negative-view", "meta", "sparse"],
)
def test_reduce_refuses_what_it_does_not_read_and_writes_nothing(loaded, made):
    tensors = made()
    out = torch.full((len(tensors), 1), 7.0, dtype=torch.float64)
    assert native.reducer()(tensors, [0], out) == 0
    assert out.eq(7.0).all()


def test_partials_of_shards_of_any_dtype(loaded):
    g = torch.Generator().manual_seed(2)
    tensors = [
        *some_tensors(),
        torch.empty(0),
        torch.tensor([3, -4, 0], dtype=torch.int32),
        torch.tensor([True, False, True]),
        torch.randn(6, generator=g).to(torch.float16),
        torch.randn(6, generator=g).to(torch.bfloat16),
        torch.tensor([3 + 4j, -1j]),
        torch.randn(5, generator=g)._neg_view(),
    ]
    out = native.partials(tensors)
    assert out.shape == (len(tensors), len(native.STATS)) and out.dtype == torch.float64
    for t, row in zip(tensors, out.tolist()):
        got = dict(zip(native.STATS, row))
        if t.numel() == 0:
            assert row == list(native.EMPTY)
            continue
        a = (t.abs() if t.is_complex() else t.resolve_neg()).double().numpy().ravel()
        with np.errstate(all="ignore"):
            want = {
                "count": a.size,
                "sum": a.sum(),
                "m2": a.var() * a.size,
                "min": a.min(),
                "max": a.max(),
                "abs_sum": np.abs(a).sum(),
                "abs_m2": np.abs(a).var() * a.size,
                "abs_min": np.abs(a).min(),
                "abs_max": np.abs(a).max(),
                "sumsq": (a * a).sum(),
                "nonfinite": (~np.isfinite(a)).sum(),
            }
        assert got == pytest.approx(want, rel=2e-6, nan_ok=True), t


def test_partials_refuse_a_tensor_without_memory_on_the_cpu(loaded):
    with pytest.raises(RuntimeError, match="plain CPU tensor"):
        native.partials([torch.ones(2, device="meta")])
