"""The sharded reductions' arithmetic: partial statistics of shards, combined, equal numpy's reductions of
the whole tensor (the 2-rank runs are in tests/torch_dist)."""

import numpy as np
import pytest
import torch

from smdebug.reductions import numpy_reduction
from smdebug_torch.sharded import combine, needed, partials

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
