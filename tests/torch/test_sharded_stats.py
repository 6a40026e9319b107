"""The sharded reductions' arithmetic: partial statistics of shards, combined, equal numpy's reductions of
the whole tensor (the 2-rank runs are in tests/torch_dist)."""

import numpy as np
import pytest
import torch

from smdebug.reductions import numpy_reduction
from smdebug_torch import native
from smdebug_torch.sharded import (
    _EMPTY,
    AM2,
    AMAX,
    AMIN,
    ASUM,
    M2,
    MAX,
    MIN,
    NONFINITE,
    SUM,
    SUMSQ,
    N,
    combine,
    needed,
    partials,
)

PAIRS = [
    (r, a)
    for r in ("min", "max", "mean", "std", "variance", "sum", "prod", "l1", "l2")
    for a in (False, True)
]


@pytest.mark.parametrize("cuts", [(0, 3, 7, 12), (0, 0, 5, 12), (0, 12, 12, 12)])
def test_combined_partials_equal_numpy_on_the_whole_tensor(cuts):
    whole = torch.randn(12, dtype=torch.float64) * 3 + 1
    shards = [whole[a:b] for a, b in zip(cuts, cuts[1:])]  # uneven, some empty
    # as the all_gather gives them: [ranks, tensors, statistics], here one tensor per rank
    gathered = partials(shards).numpy()[:, None, :]
    combined = combine(gathered)
    for pair in PAIRS:
        expected = numpy_reduction(whole.numpy(), *pair)
        assert combined[pair][0] == pytest.approx(expected, rel=1e-9, abs=1e-12), pair


def test_several_tensors_of_several_dtypes_at_once():
    a, b = torch.randn(5, 4), torch.arange(6, dtype=torch.int64).reshape(2, 3)
    rows = partials([a, b, torch.empty(0)])
    assert rows.shape == (3, 13)
    combined = combine(rows.numpy()[None])
    assert combined[("l2", False)][0] == pytest.approx(np.linalg.norm(a.numpy()), rel=1e-6)
    assert combined[("sum", False)][1] == 15
    assert np.isnan(combined[("mean", False)][2])  # empty: no reduction is saved for it


def test_a_nan_in_one_shard_propagates_as_numpy_does():
    shards = [torch.tensor([1.0, float("nan")]), torch.tensor([2.0])]
    combined = combine(partials(shards).numpy()[:, None, :])
    for pair in [("min", False), ("max", False), ("mean", False), ("l2", False)]:
        assert np.isnan(combined[pair][0]), pair


def test_an_inf_in_one_shard_gives_numpys_sum_beside_a_variance_on_torchs_path(monkeypatch):
    monkeypatch.setattr(native, "partials", lambda *args, **kwargs: None)  # the kernel not loaded
    whole = torch.tensor([float("inf"), 1.0, 2.0, -3.0])
    asked = [("sum", False), ("mean", False), ("std", False), ("sum", True), ("variance", True)]
    combined = combine(partials([whole[:3], whole[3:]], needed(asked)).numpy()[:, None, :], asked)
    for pair in asked:
        expected = numpy_reduction(whole.numpy(), *pair)
        np.testing.assert_equal(combined[pair][0], expected, err_msg=str(pair))


@pytest.mark.parametrize(
    "asked", [[("l2", False)], [("mean", False), ("max", False)], [("std", True), ("min", False)]]
)
def test_only_the_reductions_asked_are_combined_from_only_the_statistics_they_need(asked):
    whole = torch.randn(40, dtype=torch.float64) - 0.5
    shards = [whole[:25], whole[25:]]
    gathered = partials(shards, needed(asked)).numpy()[:, None, :]
    combined = combine(gathered, asked)
    assert set(combined) >= set(asked)
    for pair in asked:
        expected = numpy_reduction(whole.numpy(), *pair)
        assert combined[pair][0] == pytest.approx(expected, rel=1e-9, abs=1e-12), pair


def mixed_shards() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [
        torch.randn(64, 33, generator=g),
        torch.randn(9, 7, generator=g).t(),  # strided
        torch.empty(0),  # a rank's shard of a small tensor
        torch.tensor([1.0, float("nan"), -3.0]),
        torch.tensor([float("inf"), 2.0]),
        torch.full((4,), -3e30),  # squares overflow float32
        torch.randn(20000, generator=g) * 0.01 + 1e3,
        torch.randn(33, generator=g).double(),
        torch.tensor([3, -4, 0], dtype=torch.int32),
        torch.randn(6, generator=g).to(torch.bfloat16),
    ]


@pytest.mark.parametrize(
    "asked",
    [
        [("l2", False)],
        [("mean", False), ("max", False), ("l2", False)],
        [("std", False), ("l1", False)],
        [("min", True), ("variance", True), ("mean", True)],
    ],
)
def test_the_native_kernel_gives_the_partials_numpy_gives(asked, monkeypatch, native_kernel):
    shards, stats = mixed_shards(), needed(asked)
    calls = []
    kernel = native.partials
    monkeypatch.setattr(native, "partials", lambda *a: calls.append(1) or kernel(*a))
    fast = partials(shards, stats).numpy()
    assert calls, "the kernel was not used"
    whole = shards[0]  # and so the full tensor's reductions, from uneven shards of it
    rows = partials([whole[:40], whole[40:], whole[:0]], stats).numpy()[:, None, :]
    for pair in asked:
        expected = numpy_reduction(whole.double().numpy(), *pair)
        assert combine(rows, asked)[pair][0] == pytest.approx(expected, rel=1e-6), pair
    for shard, row in zip(shards, fast):  # as numpy computes them in float64
        a = shard.double().numpy().ravel()
        if not a.size:
            assert row.tolist() == list(_EMPTY)
            continue
        with np.errstate(all="ignore"):
            want = {N: a.size, SUM: a.sum(), M2: a.var() * a.size, MIN: a.min(), MAX: a.max()}
            m = np.abs(a)
            want.update({ASUM: m.sum(), AM2: m.var() * a.size, AMIN: m.min(), AMAX: m.max()})
            want.update({SUMSQ: (a * a).sum(), NONFINITE: (~np.isfinite(a)).sum()})
        for column in stats:
            assert row[column] == pytest.approx(want[column], rel=1e-6, nan_ok=True), (shard, column)


def test_a_product_or_a_shard_the_kernel_cannot_read_is_computed_by_torch(monkeypatch, native_kernel):
    whole = torch.randn(12, dtype=torch.float64)
    prod = combine(partials([whole[:5], whole[5:]], needed([("prod", False)])).numpy()[:, None, :])
    assert prod[("prod", False)][0] == pytest.approx(float(whole.prod()), rel=1e-9)
    sparse = torch.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse()  # the kernel refuses it
    l2 = combine(partials([sparse, torch.ones(3)], needed([("l2", False)])).numpy()[:, None, :])
    assert l2[("l2", False)][0] == pytest.approx(4.0)  # sqrt(4 + 9 + 3)
