"""The native kernel's reductions and partial statistics of lists of tensors (smdebug_torch.native),
against numpy's in float64."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from support import NUMPY_REDUCTIONS
from torch import nn

from smdebug_torch import native


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


def numpy_of(t: torch.Tensor, reduction: str, absolute: bool) -> float:
    """numpy's reduction in float64, stored in the tensor's dtype (float32's: inf past its range)."""
    a = t.double().numpy()
    with np.errstate(all="ignore"):
        found = NUMPY_REDUCTIONS[reduction](np.abs(a) if absolute else a)
        return float(np.float32(found) if t.dtype == torch.float32 else found)


def _list_reduce(tensors: list, codes: list[int], out: torch.Tensor) -> int:
    """The list reducer (a ctypes call), called as the op is."""
    found = native.list_reducer()
    assert found is not None  # (built with Python's headers, as wherever the tests run)
    array = np.array(codes, dtype=np.int64)
    return found(tensors, array.ctypes.data, len(codes), out.data_ptr(), len(tensors))


# the kernel's two entries to the reductions: the op (through torch's dispatcher), and the list reducer
ENTRIES = pytest.mark.parametrize(
    "entry", [lambda: native.reducer(), lambda: _list_reduce], ids=["op", "list"]
)


@ENTRIES
def test_reduce_writes_every_reduction_of_each_tensor_as_numpy_computes_it(native_kernel, entry):
    codes = list(range(2 * len(native.REDUCTIONS)))
    for dtype, bits in ((torch.float32, 32), (torch.float64, 64)):
        tensors = [t.to(dtype) for t in some_tensors()]
        out = torch.empty(len(tensors), len(codes), dtype=torch.float64)
        assert entry()(tensors, codes, out) == bits
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
@ENTRIES
def test_reduce_refuses_what_it_does_not_read_and_writes_nothing(native_kernel, made, entry):
    tensors = made()
    out = torch.full((len(tensors), 1), 7.0, dtype=torch.float64)
    assert entry()(tensors, [0], out) == 0
    assert out.eq(7.0).all()


def test_partials_of_shards_of_any_dtype(native_kernel):
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


def test_partials_refuse_a_tensor_without_memory_on_the_cpu(native_kernel):
    with pytest.raises(RuntimeError, match="plain CPU tensor"):
        native.partials([torch.ones(2, device="meta")])


# -- the ordinary reductions of a hook, through tensors.reductions / to_host -----------------------------
PAIRS = [(r, a) for r in native.REDUCTIONS for a in (False, True)]


@pytest.mark.usefixtures("reduction_path")
def test_every_step_reductions_of_weights_and_gradients_equal_numpy(out_dir, monkeypatch, reduction_path):
    import smdebug.pytorch as smd

    kept = []
    for entry in ("reducer", "list_reducer"):  # the path under test ran: the kernel took every list
        real = getattr(native, entry)()
        if real is not None:
            monkeypatch.setattr(native, entry, lambda real=real: lambda *a: kept.append(real(*a)) or kept[-1])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients"],
        reduction_config=smd.ReductionConfig(
            reductions=["min", "max", "mean", "std", "variance", "sum"],
            abs_reductions=["min", "max", "mean", "std", "variance", "sum"],
            norms=["l1", "l2"],
            abs_norms=["l1", "l2"],
        ),
    )
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    seen = []
    for _ in range(3):
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        model(torch.randn(4, 5)).square().mean().backward()
        seen.append((weights, {n: p.grad.clone() for n, p in model.named_parameters()}))
        opt.step()
    hook.close()
    assert (reduction_path == "native") == bool(kept) and set(kept) <= {32}
    trial = smd.create_trial(out_dir)
    for step, (weights, grads) in enumerate(seen):
        for prefix, values in (("Sequential_", weights), ("gradient/Sequential_", grads)):
            for name, value in values.items():
                tensor = trial.tensor(prefix + name)
                for reduction, absolute in PAIRS:
                    got = tensor.reduction_value(step, reduction, abs=absolute)
                    assert np.asarray(got).dtype == np.float32
                    want = numpy_of(value, reduction, absolute)
                    assert got == pytest.approx(want, rel=1e-5, abs=1e-7), (name, reduction, absolute)


def test_results_brought_to_the_host_whole_apart_and_mixed(native_kernel):
    from smdebug_torch import tensors

    pairs = [("mean", False), ("max", True), ("l2", False)]
    a, b, c, d = (torch.randn(4, 3) for _ in range(4))
    first = tensors.reductions([a, b], pairs)
    second = tensors.reductions([c, d], pairs)  # the first batch is still pending: another one
    assert all(type(r) is tensors.HostRow for r in first + second)
    assert first[0].batch is not second[0].batch
    wide = tensors.reductions([a.double()], pairs)  # float64
    half = tensors.reductions([a.half()], pairs)  # float16: torch's calls
    assert type(half[0]) is tensors.Row
    expected = [[numpy_of(t, r, x) for r, x in pairs] for t in (a, b, c, d, a, a)]

    whole = tensors.to_host(first + second)
    assert whole.dtype == np.float32 and whole.shape == (4, 3)
    np.testing.assert_allclose(whole, expected[:4], rtol=1e-6)
    again = tensors.reductions([c, a], pairs)  # to_host copied them: the kept batches are filled again
    other = tensors.reductions([b, d], pairs)  # (a step's weights, then its gradients: no new batch)
    assert (again[0].batch, other[0].batch) == (first[0].batch, second[0].batch)
    np.testing.assert_allclose(whole, expected[:4], rtol=1e-6)
    tensors.to_host(other)

    apart = tensors.to_host([again[1], *wide, *half, again[0]])
    assert [row.dtype for row in apart] == [np.float32, np.float64, np.float32, np.float32]
    np.testing.assert_allclose(
        np.array(apart, dtype=np.float64), [expected[i] for i in (4, 4, 5, 2)], rtol=1e-3
    )


def test_a_list_with_an_empty_tensor_is_left_to_torchs_calls(native_kernel):
    from smdebug_torch import tensors

    results = tensors.reductions([torch.ones(3), torch.ones(0)], [("max", False)])
    assert type(results[0]) is tensors.Row and results[1] is None  # (the core: no reduction of it)


# A child whose kernel checks (torch's calls, each releasing the GIL) are still running on the loader's
# daemon thread when its main thread ends.
EXIT_WHILE_CHECKING = """
import time
import torch
from smdebug_torch import native

checks = native._works


def slow_checks(watch):
    a, end = torch.randn(64, 64), time.monotonic() + 2
    while time.monotonic() < end:
        a @ a
    return checks(watch)


native._works = slow_checks
native.start()
time.sleep(0.3)
print("checking", native._thread.is_alive())
"""


def test_a_script_that_ends_while_the_kernel_is_checked_exits_cleanly(native_kernel, tmp_path):
    # a short training script ended while the loader thread ran torch's calls: the interpreter's exit
    # stopped that thread inside torch's C++ code and the C++ runtime aborted the process ("terminate
    # called without an active exception", exit status 134, 6 of 10 runs of a 3-step script)
    script = tmp_path / "ends_early.py"
    script.write_text(EXIT_WHILE_CHECKING)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["checking", "True"]
