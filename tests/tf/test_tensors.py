"""TF values to numpy, and reductions computed by TF, against numpy's, through the plugin hooks."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from smdebug import plugins

A = np.array([[1.0, -2.5, 7.0], [3.0, 0.5, -4.0]], dtype=np.float32)
NUMPY = {
    "min": np.min,
    "max": np.max,
    "median": np.median,
    "mean": np.mean,
    "std": np.std,
    "variance": np.var,
    "sum": np.sum,
    "prod": np.prod,
    "l1": lambda a: np.abs(a).sum(),
    "l2": lambda a: np.sqrt((a**2).sum()),
}


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
