"""Custom training loops: hook.wrap_tape (eager, tf.function, XLA) and hook.wrap_optimizer."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from tfmodels import batches, make_model, reference_gradients

import smdebug.tensorflow as smd
from smdebug.exceptions import SMDebugTypeError
from smdebug.trials import create_trial

LOSS = keras.losses.SparseCategoricalCrossentropy()


def _hook(out_dir, **kwargs):
    return smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["gradients", "weights", "biases", "losses"],
        **kwargs,
    )


def _train(hook, model, optimizer, data, compiled=None):
    def step(xb, yb):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            loss = LOSS(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if compiled is not None:
        step = tf.function(step, jit_compile=compiled)
    before = []
    for xb, yb in batches(*data):
        before.append([v.numpy().copy() for v in model.trainable_variables])
        step(tf.constant(xb), tf.constant(yb))
    return before


@pytest.mark.parametrize("compiled", [None, False], ids=["eager", "tf.function"])
def test_wrap_tape_saves_gradients_weights_and_loss(out_dir, data, compiled):
    x, y = data
    hook = _hook(out_dir)
    model = make_model()
    before = _train(hook, model, keras.optimizers.SGD(0.5), data, compiled)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2, 3]
    assert trial.tensor_names(collection="gradients") == sorted(
        f"gradients/mlp/{layer}/{kind}Grad" for layer in ("hidden", "head") for kind in ("kernel", "bias")
    )
    assert trial.tensor_names(collection="weights") == ["mlp/head/kernel", "mlp/hidden/kernel"]
    assert trial.tensor_names(collection="biases") == ["mlp/head/bias", "mlp/hidden/bias"]
    for step in (0, 3):
        xb, yb = x[step * 8 : step * 8 + 8], y[step * 8 : step * 8 + 8]
        expected, reference = reference_gradients(before[step], xb, yb)
        for path, grad in expected.items():
            np.testing.assert_allclose(
                trial.tensor(f"gradients/{path}Grad").value(step), grad, rtol=1e-4, atol=1e-6
            )
        np.testing.assert_array_equal(trial.tensor("mlp/head/kernel").value(step), before[step][2])
        loss = float(LOSS(yb, reference(xb)))
        assert float(trial.tensor("loss").value(step)) == pytest.approx(loss, rel=1e-5)


def test_wrap_tape_in_tf_function_saves_on_due_steps_only(out_dir, data):
    # only the default collections (losses), at steps 0 and 2
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_steps=[2], save_interval=100))
    model = make_model()
    _train(hook, model, keras.optimizers.SGD(0.1), data, compiled=False)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.tensor_names() == ["loss"]
    assert trial.steps() == [0, 2]


def test_wrap_tape_under_xla_warns_once_and_training_goes_on(out_dir, data, caplog_smdebug):
    hook = _hook(out_dir)
    model = make_model()
    start = [v.numpy().copy() for v in model.trainable_variables]
    _train(hook, model, keras.optimizers.SGD(0.1), data, compiled=True)
    hook.close()
    warnings = [r for r in caplog_smdebug.records if "XLA" in r.getMessage() and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "jit_compile" in warnings[0].getMessage()
    assert not np.allclose(start[2], model.trainable_variables[2].numpy())  # it trained


def test_wrap_optimizer_in_an_eager_loop(out_dir, data):
    x, y = data
    hook = _hook(out_dir)
    model = make_model()
    optimizer = keras.optimizers.SGD(0.5)
    class_apply = keras.optimizers.SGD.apply
    assert hook.wrap_optimizer(optimizer) is optimizer
    assert keras.optimizers.SGD.apply is class_apply  # this instance is wrapped, not the class
    assert "apply" not in vars(keras.optimizers.SGD(0.1))
    before = []
    for xb, yb in batches(x, y):
        before.append([v.numpy().copy() for v in model.trainable_variables])
        hook.begin_step()  # no tape: the loop tells the hook where a step starts
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    hook.close()
    trial = create_trial(out_dir)
    expected, _ = reference_gradients(before[1], x[8:16], y[8:16])
    for path, grad in expected.items():
        np.testing.assert_allclose(trial.tensor(f"gradients/{path}Grad").value(1), grad, rtol=1e-4, atol=1e-6)
    assert trial.steps() == [0, 1, 2, 3]


def test_wrap_tape_is_a_proxy_not_a_patch(out_dir):
    hook = _hook(out_dir)
    original = dict(vars(tf.GradientTape))
    tape = tf.GradientTape(persistent=True)
    wrapped = hook.wrap_tape(tape)
    assert dict(vars(tf.GradientTape)) == original  # the class is untouched (Keras' own tapes too)
    x = tf.constant(3.0)
    with wrapped as t:
        t.watch(x)  # the tape's own methods are there
        y = x * x
    assert float(t.gradient(y, x)) == 6.0
    assert float(t.gradient(y, x)) == 6.0  # persistent, as the wrapped tape is
    hook.close()
    assert hook.wrap_tape("not a tape") == "not a tape"


def test_record_tensor_value_saves_a_metric_at_the_metrics_steps(out_dir, data, caplog_smdebug):
    # smdebug 1.0's KerasHook has it (deprecated for save_tensor): the value joins the metrics collection
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=2))
    model = make_model()
    optimizer = hook.wrap_optimizer(keras.optimizers.SGD(0.1))
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    recorded = []
    for xb, yb in batches(*data):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            logits = model(xb, training=True)
            loss = LOSS(yb, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        accuracy.update_state(yb, logits)
        recorded.append(float(accuracy.result()))
        hook.record_tensor_value(tensor_name="train_accuracy", tensor_value=accuracy.result())
    hook.close()
    trial = create_trial(out_dir)
    assert trial.tensor_names(collection="metrics") == ["train_accuracy"]
    assert trial.tensor("train_accuracy").steps() == [0, 2]
    assert [float(trial.tensor("train_accuracy").value(s)) for s in (0, 2)] == pytest.approx(recorded[::2])
    deprecated = [r for r in caplog_smdebug.records if "record_tensor_value is deprecated" in r.getMessage()]
    assert len(deprecated) == 1 and "save_tensor" in deprecated[0].getMessage()

    @tf.function(autograph=False)  # (autograph would wrap the error in its own)
    def traced(v):
        hook.record_tensor_value("traced", v * 2)  # a symbolic tensor: no value to save

    with pytest.raises(SMDebugTypeError, match=r"record_tensor_value\('traced'\).*symbolic"):
        traced(tf.constant(1.0))


TAPE_SCRIPT = """
import sys, threading, time
import numpy as np, tensorflow as tf, keras
tf.config.threading.set_inter_op_parallelism_threads(4)  # TensorFlow runs independent ops at once
import smdebug.tensorflow as smd
from tfmodels import batches, make_model

hook = smd.KerasHook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=1),
                     include_collections=["weights", "biases", "gradients", "losses", "optimizer_variables"])
running, most, lock = [0], [0], threading.Lock()

def watched(method):
    def call(*args, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.2)  # a slow host: the step's other host calls are ready meanwhile
            return method(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1
    return call

hook.tape_tensors = watched(hook.tape_tensors)
hook.traced_optimizer_variables = watched(hook.traced_optimizer_variables)
model = make_model()
optimizer = hook.wrap_optimizer(keras.optimizers.Adam())
loss_fn = keras.losses.SparseCategoricalCrossentropy()

@tf.function
def step(x, y):
    with hook.wrap_tape(tf.GradientTape()) as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

rng = np.random.default_rng(0)
for xb, yb in batches(rng.normal(size=(24, 4)).astype("float32"), rng.integers(0, 3, size=24)):
    step(xb, yb)
hook.close()
print(most[0])
"""


def test_a_traced_steps_host_calls_run_one_at_a_time(tmp_path):
    """In a tf.function, TensorFlow may run the tape's host call (gradients, weights, loss) and the
    wrapped optimizer's (its variables) at once on two threads: the hook must take them one at a time
    (they both update its state; together, step 0's first variables were lost about one run in three)."""
    out = str(tmp_path / "run")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.run(
        [sys.executable, "-c", TAPE_SCRIPT, out], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "1"  # never two host calls at once
    trial = create_trial(out)
    assert trial.steps() == [0, 1, 2]
    for step in trial.steps():
        names = set(trial.tensor_names(step=step))
        assert {"loss", "mlp/hidden/kernel", "gradients/mlp/hidden/kernelGrad", "adam/iteration"} <= names
