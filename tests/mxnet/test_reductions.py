"""The batched reduction path (smdebug_reductions, smdebug_to_host) against the single one and numpy."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from conftest import Run, batches, make_net
from support import NUMPY_REDUCTIONS

import smdebug.mxnet as smd
import smdebug_mxnet.tensors
from smdebug import plugins
from smdebug.trials import create_trial

NUMPY = NUMPY_REDUCTIONS
PAIRS = [(r, a) for r in NUMPY for a in (False, True)]
HOST = np.random.RandomState(3).randn(4, 6).astype(np.float32)


@pytest.fixture(autouse=True)
def fresh_plugins():
    plugins.reset()
    yield
    plugins.reset()


@pytest.mark.parametrize("make", [mx.nd.array, mx.np.array], ids=["nd", "np"])
def test_on_the_cpu_the_batched_values_are_the_single_paths(make):
    """On the CPU the results are computed in numpy on the zero-copy view: a host array already."""
    values = [make(HOST), make(HOST * 3), make(np.arange(1, 6, dtype=np.float64))]
    updated = make(HOST)
    started = plugins.reductions([*values, updated], PAIRS)
    assert all(isinstance(s, np.ndarray) and s.shape == (len(PAIRS),) for s in started)
    updated[:] = 0  # in place, as Trainer.step updates a weight: the results keep the values asked for
    hosted = plugins.to_host(started)
    np.testing.assert_array_equal(hosted[3], hosted[0])
    for value, host in zip(values, hosted):
        array = value.asnumpy()
        for (name, absolute), got in zip(PAIRS, host):
            single = plugins.reduce(value, name, absolute)
            assert got.dtype == single.dtype == array.dtype and got == single, (name, absolute)
            want = NUMPY[name](np.abs(array) if absolute else array)
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{name} abs={absolute}")
    np.testing.assert_array_equal(values[0].asnumpy(), HOST)  # the view did not change the NDArray


def test_results_of_different_dtypes_and_empty_arrays_go_one_by_one():
    # an integer array's min is an integer, its mean a float64: each keeps its own dtype (the core's path)
    ints = mx.nd.array([1, 2, 4], dtype="int32")
    assert plugins.reductions([ints], [("min", False), ("mean", False)]) == [None]
    assert plugins.reductions([ints], [("min", False), ("max", True)])[0].tolist() == [1, 4]
    with mx.util.np_shape(True):  # zero-size shapes need NumPy shape semantics in MXNet 1.x
        empty = mx.nd.zeros((0, 3))
    got = plugins.reductions([empty, mx.nd.array(HOST)], [("max", False)])
    assert got[0] is None and got[1].tolist() == [HOST.max()]
    assert plugins.reductions([HOST], [("max", False)]) is None  # numpy's: not the plugin's


def test_small_float_tensors_are_reduced_together_as_each_alone():
    """The segment path (one concatenation, one numpy call per reduction): each tensor's results do not
    depend on the others reduced with it, and match numpy's; a large tensor goes alone."""
    rng = np.random.RandomState(5)
    values = [
        mx.nd.array(rng.randn(*shape) * scale) for shape, scale in (((3, 4), 1), ((7,), 1e3), ((1,), 2))
    ]
    values.append(mx.nd.array(rng.randn(2, 3), dtype="float64"))
    big = mx.nd.array(rng.randn(smdebug_mxnet.tensors.JOIN_ELEMENTS + 1))
    pairs = PAIRS
    together = plugins.reductions([*values, big], pairs)
    for value, got in zip([*values, big], together):
        alone = plugins.reductions([value], pairs)[0]
        np.testing.assert_array_equal(got, alone)
        assert got.dtype == value.dtype
        array = value.asnumpy()
        for (name, absolute), result in zip(pairs, got):
            want = NUMPY[name](np.abs(array) if absolute else array)
            np.testing.assert_allclose(result, want, rtol=1e-5, err_msg=f"{name} abs={absolute}")


def test_a_weight_kept_in_an_mkldnn_layout_is_still_reduced():
    """After an inference forward MXNet keeps a convolution's weight in an MKL-DNN layout, which has no
    zero-copy view: its reductions come from a copy."""
    conv = mx.gluon.nn.Conv2D(4, 3)
    conv.initialize()
    conv(mx.nd.ones((1, 1, 5, 5)))
    weight = conv.weight.data()
    got = plugins.reductions([weight], [("max", False), ("l2", False)])[0]
    array = weight.asnumpy()
    np.testing.assert_allclose(got, [array.max(), np.sqrt((array * array).sum())], rtol=1e-6)


def test_the_device_path_leaves_results_on_the_device_until_to_host():
    """The NDArray operators a GPU uses (run here on the CPU context, where they work as well): one 1-d
    NDArray per value, nothing copied until to_host, which gives reduce_on_device's values."""
    from smdebug_mxnet.tensors import reduce_on_device, reductions_on_device, to_host

    pairs = [p for p in PAIRS if p[0] != "median"]
    values = [mx.nd.array(HOST), mx.nd.array(HOST * 2, dtype="float64"), mx.nd.array(HOST[:2] - 1)]
    started = [reductions_on_device(v, pairs) for v in values]
    assert all(isinstance(s, mx.nd.NDArray) and s.shape == (len(pairs),) for s in started)
    mixed = [started[0], np.array([7.0]), started[1], started[2]]  # a CPU result among them passes through
    hosted = to_host(mixed)
    assert hosted[1].tolist() == [7.0]
    for value, host in zip(values, [hosted[0], hosted[2], hosted[3]]):
        assert host.dtype == value.dtype
        for (name, absolute), got in zip(pairs, host):
            single = reduce_on_device(mx.nd.abs(value) if absolute else value, name)
            assert got.dtype == single.dtype and got == single, (name, absolute)
    assert reductions_on_device(values[0], [("median", False)]) is None  # no operator: one by one


@pytest.mark.parametrize("device", [False, True], ids=["cpu-numpy", "device-operators"])
def test_a_run_brings_each_steps_reductions_over_once(tmp_path, monkeypatch, device):
    """One smdebug_to_host call per step with all its tensors' results, saved with the single path's
    values; with ``device`` the NDArray operators' path (a GPU's) is taken on the CPU context."""
    if device:
        monkeypatch.setattr(smdebug_mxnet.tensors, "on_host", lambda value: False)
    calls = []
    real = plugins.to_host

    def counting(results):
        calls.append([type(r) for r in results])
        return real(results)

    monkeypatch.setattr(plugins, "to_host", counting)
    net, loss_fn = make_net()
    out_dir = str(tmp_path / "run")
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients"],
        reduction_config=smd.ReductionConfig(reductions=["mean", "max", "std"], norms=["l2", "l1"]),
    )
    hook.register_block(net)
    hook.register_block(loss_fn)
    run = Run(hook, net, loss_fn)
    run.train(batches(3))
    hook.close()

    kind = mx.nd.NDArray if device else np.ndarray
    assert [len(c) for c in calls] == [8, 8, 8]  # 4 parameters and their 4 gradients, per step
    assert all(issubclass(t, kind) for c in calls for t in c)
    trial = create_trial(out_dir)
    for name in ("dense0_weight", "gradient/dense1_weight"):
        tensor = trial.tensor(name)
        for step in (0, 1, 2):
            seen = mx.nd.array(run.seen[step][name])
            for reduction in ("mean", "max", "std", "l2", "l1"):
                got = tensor.reduction_value(step, reduction)
                assert got == plugins.reduce(seen, reduction, False), (name, step, reduction)
