"""TF values to numpy, and reductions computed by TF, against numpy's, through the plugin hooks."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from support import NUMPY_REDUCTIONS

from smdebug import plugins

A = np.array([[1.0, -2.5, 7.0], [3.0, 0.5, -4.0]], dtype=np.float32)
NUMPY = NUMPY_REDUCTIONS


@pytest.mark.parametrize(
    "make", [tf.constant, tf.Variable, keras.Variable], ids=["tensor", "tf.Variable", "keras"]
)
def test_reductions_equal_numpy(make):
    value = make(A)
    np.testing.assert_array_equal(plugins.to_numpy(value), A)
    for name, fn in NUMPY.items():
        for absolute in (False, True):
            got = plugins.reduce(value, name, absolute)
            assert got == pytest.approx(fn(np.abs(A) if absolute else A), rel=1e-5), (name, absolute)


def test_a_saved_variable_keeps_the_value_it_had():
    variable = tf.Variable(A)
    array = plugins.to_numpy(variable)
    variable.assign(A * 0)
    np.testing.assert_array_equal(array, A)


def test_other_dtypes_and_values():
    assert plugins.to_numpy(tf.constant([1.5], dtype=tf.bfloat16)).dtype == np.float32
    assert plugins.reduce(tf.constant([1, 2]), "mean", False) == 1.5  # integers as numpy reduces them
    assert np.isnan(plugins.reduce(tf.constant([1.0, np.nan]), "median", False))
    assert plugins.reduce(tf.constant([1.0, 2.0, 3.0, 10.0]), "median", False) == 2.5
    sparse = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([1]), tf.constant([3, 2]))
    np.testing.assert_array_equal(plugins.to_numpy(sparse), [[0, 0], [1, 2], [0, 0]])
    assert plugins.to_numpy(np.arange(3)) is not None  # not TensorFlow's: the core's numpy answers


PAIRS = [(r, a) for r in NUMPY for a in (False, True)]


@pytest.mark.parametrize(
    "make", [tf.constant, tf.Variable, keras.Variable], ids=["tensor", "tf.Variable", "keras"]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
def test_batched_reductions_equal_the_single_path(make, dtype):
    """One 1-d tensor per value, brought over with the others in one call: each element is exactly the
    value (and dtype) smdebug_reduce gives, and numpy's."""
    values = [make(A.astype(dtype)), make((A * 3).astype(dtype)), make(np.arange(5, dtype=dtype))]
    started = plugins.reductions(values, PAIRS)
    from smdebug_tf.tensors import Pending

    assert all(isinstance(s, Pending) for s in started)  # computed together in to_host
    hosted = plugins.to_host(started)
    assert all(h.shape == (len(PAIRS),) for h in hosted)
    for value, host in zip(values, hosted):
        array = plugins.to_numpy(value).astype(np.float32 if dtype == np.float16 else dtype)  # as TF
        for (name, absolute), got in zip(PAIRS, host):
            single = plugins.reduce(value, name, absolute)
            assert got.dtype == single.dtype and (got == single or np.isnan(single)), (name, absolute)
            want = NUMPY[name](np.abs(array) if absolute else array)
            assert got == pytest.approx(want, rel=1e-2 if dtype == np.float16 else 1e-5), (name, absolute)


def test_batched_reductions_edges():
    nan = plugins.to_host(plugins.reductions([tf.constant([1.0, np.nan, 3.0])], [("median", False)]))
    assert np.isnan(nan[0][0])
    even = plugins.reductions([tf.constant([1.0, 2.0, 3.0, 10.0])], [("median", False), ("median", True)])
    np.testing.assert_array_equal(plugins.to_host(even)[0], [2.5, 2.5])
    # empty (undefined), complex and text: None, so that the core reduces them one by one as before
    odd = [tf.zeros([0, 3]), tf.constant([3 + 4j]), tf.constant(["a"]), np.arange(3), tf.constant([2.0])]
    started = plugins.reductions(odd, [("max", False)])
    assert started[:4] == [None] * 4
    np.testing.assert_array_equal(plugins.to_host(started[4:])[0], [2.0])
    sparse = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([1]), tf.constant([3, 2]))
    np.testing.assert_array_equal(plugins.to_host(plugins.reductions([sparse], [("sum", False)]))[0], [3.0])
    from smdebug_tf.tensors import reductions

    with pytest.raises(ValueError, match="unknown reduction"):
        reductions([tf.constant([1.0])], [("nope", False)])


def test_a_keras_run_computes_each_steps_reductions_in_the_step(tmp_path, monkeypatch, data):
    """Every step's reductions are computed by the step's own graph and reach the core in one
    smdebug_to_host call already on the host (no graph of their own), with the values of the single path."""
    from tfmodels import WeightsBefore, make_model

    import smdebug.tensorflow as smd
    from smdebug.trials import create_trial
    from smdebug_tf import tensors as tf_tensors

    calls = []
    real = plugins.to_host

    def counting(results):
        calls.append([type(r) for r in results])
        return real(results)

    programs = []
    real_program = tf_tensors._program
    monkeypatch.setattr(tf_tensors, "_program", lambda *a: programs.append(a) or real_program(*a))
    monkeypatch.setattr(plugins, "to_host", counting)
    out_dir = str(tmp_path / "run")
    hook = smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients"],
        reduction_config=smd.ReductionConfig(reductions=["mean", "max", "median"], norms=["l2"]),
    )
    before = WeightsBefore()
    x, y = data
    model = make_model()
    model.fit(x, y, epochs=1, batch_size=8, shuffle=False, callbacks=[before, hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    steps = trial.steps()
    assert len(steps) == 4 and len(calls) == 4  # one call per step ...
    tensors = [n for n in trial.tensor_names() if "kernel" in n or "bias" in n]
    assert len(tensors) == 8
    # ... with all its tensors, computed in the step
    assert all(len(c) == 8 and all(t is np.ndarray for t in c) for c in calls)
    assert programs == []
    kernel = trial.tensor("mlp/hidden/kernel")
    for step in steps:
        start = tf.constant(before.at[step][0])
        for name in ("mean", "max", "median", "l2"):
            assert kernel.reduction_value(step, name) == plugins.reduce(start, name, False), (step, name)


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_a_step_packs_its_tensors_into_a_few_buffers(jit):
    """pack (in a compiled step) and unpack (on the host): raw values and the reductions TF computes in the
    step, for static and run-time shapes, several dtypes, an empty tensor and tensors the core reduces."""
    from smdebug_tf.packing import pack, unpack
    from smdebug_tf.tensors import Captured

    pairs = (("mean", False), ("max", True), ("l2", False), ("median", False))
    plans = {
        "w": (pairs, True),  # static float32: raw and reductions
        "b": ((("sum", False),), False),  # static float32: reductions only
        "ints": (pairs, True),  # static int64: float64 reductions
        "x": (pairs, True),  # batch dimension known only at run time
        "none": (pairs, True),  # empty at run time
        "later": None,  # not due
    }
    values = {
        "w": A,
        "b": A[0] * 2,
        "ints": np.arange(6, dtype=np.int64).reshape(2, 3),
        "x": np.arange(12, dtype=np.float32).reshape(4, 3) - 5,
        "none": np.zeros((0, 3), np.float32),
        "later": A,
    }

    def step(x, none):
        tensors = {n: tf.constant(v) for n, v in values.items() if n not in ("x", "none")}
        tensors.update(x=x * 1, none=none * 1)
        return pack(tensors, plans.get)

    spec = [tf.TensorSpec([None, 3], tf.float32)] * 2
    packed = tf.function(step, input_signature=spec, jit_compile=jit)(values["x"], values["none"])
    buffers = next(iter(packed.values()))
    assert len(buffers) == 6  # raw: float32, int64, x, none; reductions: float32, float64
    (got,) = unpack({k: tuple((b,) for b in v) for k, v in packed.items()})
    got = dict(got)
    assert set(got) == {"w", "b", "ints", "x", "none"}
    for name, captured in got.items():
        assert isinstance(captured, Captured)
        want_pairs = plans[name][0]
        if plans[name][1]:
            np.testing.assert_array_equal(captured.to_numpy(), values[name])
        else:
            assert captured.host is None
        if name == "none":
            assert captured.empty and captured.row is None
            continue
        array = values[name].astype(np.float64 if name == "ints" else np.float32)
        want = [NUMPY[r](np.abs(array) if a else array) for r, a in want_pairs]
        np.testing.assert_allclose(captured.reductions(want_pairs), want, rtol=1e-6)
        assert captured.reductions(want_pairs).dtype == array.dtype
    # any order of the computed pairs, and None for a pair the step did not compute
    np.testing.assert_array_equal(got["w"].reductions([("l2", False), ("mean", False)]), got["w"].row[[2, 0]])
    assert got["w"].reductions([("min", False)]) is None
    # through the plugin hooks: raw values as they are, reductions on the host already
    assert plugins.to_numpy(got["w"]) is got["w"].host
    started = plugins.reductions([got["w"], got["x"]], list(pairs))
    assert all(isinstance(s, np.ndarray) for s in started)
    with pytest.raises(ValueError, match="empty"):
        plugins.reduce(got["none"], "max", False)


def test_a_step_hands_text_and_complex_values_to_the_core():
    from smdebug_tf.packing import pack, unpack

    pairs = (("max", False),)
    tensors = {"text": tf.constant(["a", "bc"]), "z": tf.constant([3 + 4j])}
    packed = tf.function(lambda: pack(tensors, lambda name: (pairs, False)))()
    (got,) = unpack({k: tuple((b,) for b in v) for k, v in packed.items()})
    got = dict(got)
    assert got["text"].dtype == object and list(got["text"]) == [b"a", b"bc"]
    np.testing.assert_array_equal(got["z"], [3 + 4j])  # numpy arrays: the core reduces |z| itself
