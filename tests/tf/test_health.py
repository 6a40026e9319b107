"""KerasHook(health=True): every training step's statistics computed inside the compiled step, the flight
recorder written when something goes wrong, and where the first non-finite value came from, with faults
planted into real Keras training."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from support import first_loss_spike

import smdebug.tensorflow as smd
from smdebug.cli import main as cli
from smdebug.exceptions import TensorUnavailableForStep

FAULT = 4


class Plant(keras.layers.Layer):
    """Scales its input by a weight of its own; at training call FAULT, an inf in its output ("forward")
    or a NaN in its weight's gradient ("gradient")."""

    def __init__(self, fault=None, **kwargs):
        super().__init__(**kwargs)
        self.fault = fault

    def build(self, shape):
        self.scale = self.add_weight(shape=(shape[-1],), initializer="ones", name="scale")
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, name="calls")

    def call(self, x, training=False):
        # the "eval" fault: at the evaluation call FAULT (training calls count apart)
        hit = tf.logical_and(tf.equal(self.calls, FAULT), training != (self.fault == "eval"))
        if training != (self.fault == "eval"):
            self.calls.assign_add(1.0)
        scale = self.scale
        if self.fault == "gradient":

            @tf.custom_gradient
            def poisoned(s):
                def grad(dy):
                    return tf.where(hit, dy * np.nan, dy)

                return tf.identity(s), grad

            scale = poisoned(tf.convert_to_tensor(scale))  # (a tensor: eager code too)
        out = x * scale
        if self.fault in ("forward", "eval"):
            out = tf.where(hit, out + np.inf, out)
        return out


class Seen(keras.callbacks.Callback):
    """The l2 norm of the hidden layer's kernel as each training batch starts."""

    def __init__(self):
        super().__init__()
        self.norms = []

    def on_train_batch_begin(self, batch, logs=None):
        self.norms.append(float(np.linalg.norm(self.model.get_layer("hidden").kernel.numpy())))


class LearningRateJump(keras.callbacks.Callback):
    """The learning rate times 1e4 from training batch ``at`` on (its update makes the next loss spike)."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.at:
            self.model.optimizer.learning_rate.assign(self.model.optimizer.learning_rate * 1e4)


def train(
    out_dir,
    fault=None,
    steps=8,
    jit_compile=False,
    include=None,
    validation=False,
    lr_jump_at=None,
    **hook_args,
):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(5, activation="relu", name="hidden"),
            Plant(fault, name="plant"),
            keras.layers.Dense(3, activation="softmax", name="head"),
        ],
        name="mlp",
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", jit_compile=jit_compile)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8 * steps, 4)).astype("float32")
    y = rng.integers(0, 3, size=8 * steps)
    if fault == "input":
        x[8 * FAULT + 2, 1] = np.nan
    hook = smd.KerasHook(
        out_dir=out_dir,
        health=True,
        save_config=smd.SaveConfig(save_interval=5),
        include_collections=include,
        **hook_args,
    )
    seen = Seen()
    jump = [LearningRateJump(lr_jump_at)] if lr_jump_at is not None else []
    # validation: as many batches as training, each of them evaluated after the epoch's training steps
    data = (x, y) if validation else None
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=1,
        shuffle=False,
        callbacks=[seen, *jump, hook],
        verbose=0,
        validation_data=data,
    )
    hook.close()
    return seen.norms


def why(out_dir, *args):
    from contextlib import redirect_stdout
    from io import StringIO

    buffer = StringIO()
    with redirect_stdout(buffer):
        assert cli(["why", *args, out_dir]) == 0
    return buffer.getvalue()


@pytest.mark.parametrize("validation", [False, True])
def test_healthy_run_writes_nothing_between_save_steps(out_dir, validation):
    norms = train(out_dir, validation=validation)
    trial = smd.create_trial(out_dir)
    # the save steps, and the epoch's last step (its logs); with validation, EVAL's save steps (its mode
    # steps 0 and 5) and its last step (the validation logs)
    assert trial.steps() == [0, 5, 7] + ([8, 13, 15] if validation else [])
    # no statistics at the others
    assert trial.tensor("mlp/hidden/kernel").steps() == [0, 5] + ([8, 13] if validation else [])
    assert trial.first_nonfinite() is None
    # a save step carries the statistics computed in the compiled step
    kernel = trial.tensor("mlp/hidden/kernel").reduction_value(5, "l2")
    assert kernel == pytest.approx(norms[5], rel=1e-5)
    assert "Nothing was found" in why(out_dir)


@pytest.mark.parametrize(
    "fault, direction, tensor",
    [("forward", "forward", "plant/outputs"), ("gradient", "backward", "gradients/mlp/plant/scaleGrad")],
)
def test_first_nonfinite_names_where_it_appeared(out_dir, fault, direction, tensor):
    norms = train(out_dir, fault=fault)
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert first is not None
    assert {k: first[k] for k in ("step", "mode", "direction", "module", "tensor", "worker")} == {
        "step": FAULT,
        "mode": "TRAIN",
        "direction": direction,
        "module": "plant",
        "tensor": tensor,
        "worker": "worker_0",
    }
    # the recorder's rows of the steps before, as ordinary reductions of their own steps
    for step in range(FAULT):
        kernel = trial.tensor("mlp/hidden/kernel").reduction_value(step, "l2")
        assert kernel == pytest.approx(norms[step], rel=1e-5)
        assert np.isfinite(trial.tensor("loss").reduction_value(step, "max", abs=True))
    assert not np.isfinite(trial.tensor("loss").reduction_value(FAULT, "l2")) or direction == "backward"
    assert trial.steps() == [*range(FAULT + 2), 7]  # after the fault: the save step, the epoch's logs
    assert json.loads(why(out_dir, "--json"))["tensor"] == tensor
    assert "the largest gradient norm at step 3 was gradients/mlp/" in why(out_dir)  # (TF names)


def test_statistics_inside_an_xla_compiled_step(out_dir):
    norms = train(out_dir, fault="gradient", jit_compile=True)
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["module"]) == (FAULT, "backward", "plant")
    kernel = trial.tensor("mlp/hidden/kernel").reduction_value(FAULT - 1, "l2")
    assert kernel == pytest.approx(norms[FAULT - 1], rel=1e-5)


def test_a_trigger_saves_the_raw_tensors_the_collections_name(out_dir):
    include = ["weights", "gradients", "layers", "losses"]
    norms = train(out_dir, fault="gradient", include=include)
    trial = smd.create_trial(out_dir)
    assert trial.first_nonfinite()["step"] == FAULT
    # the triggering step's own tensors, raw, although no save step is due there
    kernel = trial.tensor("mlp/hidden/kernel")
    assert FAULT in kernel.steps()
    assert np.linalg.norm(kernel.value(FAULT)) == pytest.approx(norms[FAULT], rel=1e-5)  # as the step began
    assert np.isnan(trial.tensor("gradients/mlp/plant/scaleGrad").value(FAULT)).any()
    assert trial.tensor("plant/outputs").value(FAULT).shape == (8, 5)
    assert FAULT in trial.tensor("loss").steps()
    # the steps before have their statistics only
    assert FAULT - 1 not in trial.tensor("plant/outputs").steps()
    with pytest.raises(TensorUnavailableForStep):
        kernel.value(FAULT - 1)


def test_a_fault_in_evaluation_is_found_in_eval_mode(out_dir):
    train(out_dir, fault="eval", validation=True)
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert first is not None
    assert (first["mode"], first["direction"], first["module"], first["tensor"]) == (
        "EVAL",
        "forward",
        "plant",
        "plant/outputs",
    )
    assert first["step"] == 8 + FAULT  # 8 training steps, then the evaluation's steps
    assert first["mode_step"] == FAULT
    # the evaluation steps before it were recorded: the loss of each, in EVAL mode
    loss = trial.tensor("loss")
    for mode_step in range(FAULT):
        step = 8 + mode_step
        assert np.isfinite(loss.reduction_value(step, "l2"))


def test_a_nan_in_a_predict_batch_is_found_in_predict_mode(out_dir):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="dense")], name="net")
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    x[20, 1] = np.nan  # in the second batch of 16
    hook = smd.KerasHook(out_dir=out_dir, health=True)
    model.predict(x, batch_size=16, callbacks=[hook], verbose=0)
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    assert {k: first[k] for k in ("step", "mode", "mode_step", "direction", "tensor")} == {
        "step": 1,
        "mode": "PREDICT",
        "mode_step": 1,
        "direction": "input",
        "tensor": "model_input",
    }


def test_a_nan_in_a_training_batch_is_found_at_the_input(out_dir):
    train(out_dir, fault="input")
    first = smd.create_trial(out_dir).first_nonfinite()
    assert {k: first[k] for k in ("step", "mode", "direction", "module", "tensor")} == {
        "step": FAULT,
        "mode": "TRAIN",
        "direction": "input",
        "module": "mlp",
        "tensor": "model_input",
    }


class Subclassed(keras.Model):
    """Built by its first call inside fit; its own train_step calls compute_loss and changes nothing."""

    def __init__(self):
        super().__init__(name="sub")
        self.hidden = keras.layers.Dense(5, name="hidden")
        self.plant = Plant("forward", name="plant")

    def call(self, x, training=False):
        return self.plant(self.hidden(x), training=training)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return {"loss": loss}


def test_a_subclassed_model_built_inside_fit(out_dir):
    keras.utils.set_random_seed(0)
    model = Subclassed()
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 4)).astype("float32"), rng.normal(size=(48, 5)).astype("float32")
    hook = smd.KerasHook(out_dir=out_dir, health=True)
    model.fit(x, y, batch_size=8, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["module"], first["tensor"]) == (
        FAULT,
        "forward",
        "plant",
        "plant/outputs",
    )
    for step in range(FAULT):  # the batch's loss, as the custom train_step computed it
        assert np.isfinite(trial.tensor("loss").reduction_value(step, "l2"))
        assert np.isfinite(trial.tensor("sub/hidden/kernel").reduction_value(step, "l2"))


def test_a_nan_in_a_batch_of_labels_is_found_at_the_input(out_dir):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="dense")], name="net")
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 4)).astype("float32"), rng.normal(size=(48, 2)).astype("float32")
    y[8 * FAULT + 3, 1] = np.nan
    hook = smd.KerasHook(out_dir=out_dir, health=True)
    model.fit(x, y, batch_size=8, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    assert (first["step"], first["direction"], first["module"], first["tensor"]) == (
        FAULT,
        "input",
        "net",
        "labels",
    )


@pytest.mark.parametrize("bad", ["model_input_1", "labels_1"])
def test_a_nan_in_one_of_several_inputs_or_labels_is_named_as_it_is_saved(out_dir, bad):
    keras.utils.set_random_seed(0)
    a, b = keras.Input((3,), name="a"), keras.Input((4,), name="b")
    both = keras.layers.Concatenate(name="cat")(
        [keras.layers.Dense(2, name="da")(a), keras.layers.Dense(2, name="db")(b)]
    )
    model = keras.Model(
        [a, b], [keras.layers.Dense(1, name="one")(both), keras.layers.Dense(2, name="two")(both)], name="net"
    )
    model.compile(optimizer="sgd", loss=["mse", "mse"])
    rng = np.random.default_rng(0)
    xa, xb = rng.normal(size=(48, 3)).astype("float32"), rng.normal(size=(48, 4)).astype("float32")
    y1, y2 = rng.normal(size=(48, 1)).astype("float32"), rng.normal(size=(48, 2)).astype("float32")
    (xb if bad == "model_input_1" else y2)[8 * FAULT + 1, 0] = np.nan
    hook = smd.KerasHook(out_dir=out_dir, health=True, include_collections=["inputs", "outputs"])
    model.fit([xa, xb], [y1, y2], batch_size=8, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["module"], first["tensor"]) == (
        FAULT,
        "input",
        "net",
        bad,
    )
    assert np.isnan(trial.tensor(bad).value(FAULT)).any()  # the trigger saved it under that name


def test_a_huge_finite_value_is_no_fault_and_no_numpy_warning(out_dir):
    import warnings

    keras.utils.set_random_seed(0)
    bias = keras.initializers.Constant(1e20)  # finite, its square past float32's range
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="d", bias_initializer=bias)])
    model.compile(optimizer="sgd", loss="mae")  # (the loss stays finite, ~1e20)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")
    hook = smd.KerasHook(out_dir=out_dir, health=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()
    assert smd.create_trial(out_dir).first_nonfinite() is None
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in seen]


def test_a_loss_spike_from_a_learning_rate_jump_writes_the_recorder(out_dir):
    norms = train(out_dir, steps=12, lr_jump_at=8, health_loss_factor=3, include=["weights", "losses"])
    trial = smd.create_trial(out_dir)
    spike = first_loss_spike(trial)
    assert spike == 9  # the loss of the step after the jump (not a save step)
    # the steps before, as reductions; the spiking step's weights raw, as the user's collections name them
    kernel = trial.tensor("mlp/hidden/kernel")
    for step in range(1, spike):
        assert kernel.reduction_value(step, "l2") == pytest.approx(norms[step], rel=1e-5)
    assert np.linalg.norm(kernel.value(spike)) == pytest.approx(norms[spike], rel=1e-5)


class NanGradientFrom(keras.layers.Layer):
    """Scales its input by a weight of its own whose gradient is NaN from training call ``at`` on."""

    def __init__(self, at, **kwargs):
        super().__init__(**kwargs)
        self.at = at

    def build(self, shape):
        self.scale = self.add_weight(shape=(shape[-1],), initializer="ones", name="scale")
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, name="calls")

    def call(self, x):
        hit = self.calls >= self.at
        self.calls.assign_add(1.0)

        @tf.custom_gradient
        def poisoned(s):
            return tf.identity(s), lambda dy: tf.where(hit, dy * np.nan, dy)

        return x * tf.cast(poisoned(self.scale), x.dtype)


def test_mixed_precision_loss_scale_overflows_are_not_reported(out_dir):
    # mixed_float16 wraps the optimizer in a LossScaleOptimizer: the first steps' scaled gradients
    # overflow float16 and their updates are skipped by design (the scale halves each time); from step
    # 12 on a gradient is NaN whatever the scale: once the scale is down to 1 it is reported, at 12
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8, activation="relu", name="hidden"),
                NanGradientFrom(12, name="plant"),
                keras.layers.Dense(1, name="head", dtype="float32"),
            ],
            name="mlp",
        )
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
        rng = np.random.default_rng(0)
        x = rng.normal(size=(8 * 24, 4)).astype("float32") * 10
        y = rng.normal(size=(8 * 24, 1)).astype("float32") * 100
        hook = smd.KerasHook(out_dir=out_dir, health=True)
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[hook], verbose=0)
        hook.close()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["module"]) == (12, "backward", "plant")
    # the recorder holds the loss scale the steps' gradients had: the first steps overflowed
    scale = trial.tensor("loss_scale_optimizer/dynamic_scale")
    assert scale.reduction_value(0, "l2") == 2.0**15
    assert scale.reduction_value(11, "l2") < 2.0**15
    assert not np.isfinite(trial.tensor("gradients/mlp/hidden/kernelGrad").reduction_value(0, "l2"))
    assert np.isfinite(trial.tensor("gradients/mlp/hidden/kernelGrad").reduction_value(11, "l2"))


class RaiseAt(keras.callbacks.Callback):
    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.batch:
            raise RuntimeError("a callback broke")


@pytest.mark.parametrize("where", ["data", "callback"])
def test_training_that_raises_inside_fit_writes_the_recorder(out_dir, where):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="dense")], name="net")
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)

    def batches():
        for step in range(8):
            if where == "data" and step == FAULT:
                raise RuntimeError("the data broke")
            yield rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 3)).astype("float32")

    spec = (tf.TensorSpec((8, 4), tf.float32), tf.TensorSpec((8, 3), tf.float32))
    data = tf.data.Dataset.from_generator(batches, output_signature=spec)
    hook = smd.KerasHook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    callbacks = [RaiseAt(FAULT), hook] if where == "callback" else [hook]
    with pytest.raises(Exception, match="broke"):  # the user's error reaches the user, whatever the hook
        model.fit(data, epochs=1, callbacks=callbacks, verbose=0)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps() == list(range(FAULT))  # the recorder's steps, written as the error went by
    for step in range(1, FAULT):
        assert np.isfinite(trial.tensor("net/dense/kernel").reduction_value(step, "l2"))
    reasons = [t["reason"] for t in trial.health_records()[0]["triggers"]]
    assert len(reasons) == 1 and reasons[0].startswith("training raised"), reasons
    assert where != "data" or reasons[0].endswith("RuntimeError: the data broke"), reasons
    assert trial.first_nonfinite() is None


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("planted", ["in the backward pass", "before the update"])
def test_a_custom_loop_with_a_wrapped_tape(out_dir, compiled, planted):
    keras.utils.set_random_seed(1)
    fault = "gradient" if planted == "in the backward pass" else None
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(5, name="hidden"), Plant(fault, name="plant")], name="mlp"
    )
    hook = smd.KerasHook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    optimizer = hook.wrap_optimizer(keras.optimizers.SGD(0.1))

    def step(x, y, poison):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        # the script's own change to a gradient: what the update uses is recorded
        grads = [
            tf.where(poison, g * np.nan, g) if v.path == "mlp/plant/scale" else g
            for g, v in zip(grads, model.trainable_variables)
        ]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    step = tf.function(step) if compiled else step
    rng = np.random.default_rng(0)
    norms = []
    for i in range(FAULT + 2):
        norms.append(float(np.linalg.norm(model.get_layer("hidden").kernel.numpy())))
        x, y = rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 5)).astype("float32")
        step(x, y, tf.constant(fault is None and i == FAULT))
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert {k: first[k] for k in ("step", "mode", "direction", "module", "tensor")} == {
        "step": FAULT,
        "mode": "TRAIN",
        "direction": "backward",
        "module": "plant",
        "tensor": "gradients/mlp/plant/scaleGrad",
    }
    for step_ in range(FAULT):
        value = trial.tensor("mlp/hidden/kernel").reduction_value(step_, "l2")
        assert value == pytest.approx(norms[step_], rel=1e-5)
        assert np.isfinite(trial.tensor("loss").reduction_value(step_, "max", abs=True))


UNMODIFIED = textwrap.dedent(
    """
    import os, signal
    import numpy as np, keras

    class Interrupt(keras.callbacks.Callback):  # Ctrl-C at the sixth batch
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 5:
                os.kill(os.getpid(), signal.SIGINT)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="dense")], name="net")
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 2)).astype("float32")
    model.fit(x, y, batch_size=8, shuffle=False, callbacks=[Interrupt()], verbose=0)
    """
)


def test_sigint_in_an_unmodified_script_run_with_health(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNMODIFIED)
    out = str(tmp_path / "run")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMDEBUG")}
    smdebug = str(Path(sys.executable).parent / "smdebug")
    proc = subprocess.run(
        [smdebug, "run", "--health", "--out-dir", out, "--", sys.executable, str(script)],
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=300,
        # Ctrl-C must reach the script even when pytest runs as a background job (SIGINT ignored, inherited)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert "KeyboardInterrupt" in proc.stderr, proc.stderr[-2000:]
    trial = smd.create_trial(out)
    assert trial.steps() == [0, 1, 2, 3, 4]  # the recorder, written on SIGINT
    for step in range(5):
        assert np.isfinite(trial.tensor("net/dense/kernel").reduction_value(step, "l2"))
    assert [t["reason"] for t in trial.health_records()[0]["triggers"]] == [f"signal {signal.SIGINT.name}"]


def test_mixed_precision_custom_loop_overflows_are_not_reported(out_dir):
    # a custom loop scaling its loss with a LossScaleOptimizer: its first updates overflow and are skipped
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, name="hidden"), keras.layers.Dense(1, dtype="float32")],
            name="mlp",
        )
        hook = smd.KerasHook(out_dir=out_dir, health=True)
        optimizer = hook.wrap_optimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1e-4)))

        @tf.function
        def step(x, y):
            with hook.wrap_tape(tf.GradientTape()) as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
                scaled = optimizer.scale_loss(loss)
            optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
            return loss

        rng = np.random.default_rng(0)
        losses = [
            float(
                step(
                    rng.normal(size=(8, 4)).astype("float32") * 10,
                    rng.normal(size=(8, 1)).astype("float32") * 100,
                )
            )
            for _ in range(10)
        ]
        hook.health.trigger("look")  # write the recorder of a healthy run
        hook.close()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    trial = smd.create_trial(out_dir)
    assert trial.first_nonfinite() is None
    scale = trial.tensor("loss_scale_optimizer/dynamic_scale")
    assert scale.reduction_value(9, "l2") < scale.reduction_value(0, "l2") == 2.0**15  # it overflowed
    assert not np.isfinite(trial.tensor("gradients/mlp/hidden/kernelGrad").reduction_value(0, "l2"))
    # the loss as computed, not as scaled
    assert trial.tensor("loss").reduction_value(3, "l2") == pytest.approx(losses[3], rel=1e-3)


def test_a_trigger_in_validation_keeps_what_the_epoch_saved_and_its_own_row(out_dir):
    """A NaN in the epoch's second validation batch: the recorder writes its rows into steps the hook had
    already written after they ended (the epoch's training logs, saved as validation begins), and the
    epoch's val_* logs go into the triggering step after its row: each step keeps both."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="a"), keras.layers.Dense(1, name="b")],
        name="m",
    )
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = x.sum(1, keepdims=True)
    x_val = x[:16].copy()
    x_val[12, 1] = np.nan  # the second validation batch of 8: global step 5 (4 training steps first)
    hook = smd.KerasHook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    model.fit(x, y, batch_size=8, epochs=1, validation_data=(x_val, y[:16]), callbacks=[hook], verbose=0)
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["mode"], first["direction"]) == (5, "EVAL", "input")
    loss = trial.tensor("loss")
    # step 3, the epoch's last training step: its training logs (saved whatever the configuration) and
    # its recorded row
    assert loss.value(3).shape == ()
    assert np.isfinite(loss.reduction_value(3, "l2"))
    # step 5, the trigger: its own row (the recorder's first non-finite step) and the epoch's val_loss
    assert not np.isfinite(loss.reduction_value(5, "l2"))
    assert np.isfinite(trial.tensor("m/a/kernel").reduction_value(5, "l2"))
    assert not np.isfinite(trial.tensor("val_loss").value(5))


def test_the_epochs_training_logs_are_saved_with_health_as_without(tmp_path):
    """smdebug 1.0 saves each epoch's training logs (loss, metrics, batch) at its last training step
    whatever the save configuration; with health=True every step goes through the hook's step function,
    and the epoch's batch metric was taken for saved there (at a step that saved nothing)."""
    saved = {}
    for health in (False, True):
        out = str(tmp_path / f"run_{health}")
        model = make_health_model()
        hook = smd.KerasHook(out_dir=out, health=health, save_config=smd.SaveConfig(save_interval=100))
        x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
        model.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=2, callbacks=[hook], verbose=0)
        hook.close()
        trial = smd.create_trial(out)
        saved[health] = {name: trial.tensor(name).steps() for name in ("loss", "batch")}
    assert saved[False] == {"loss": [0, 3, 7], "batch": [0, 3, 7]}
    assert saved[True]["batch"] == saved[False]["batch"]
    assert set(saved[False]["loss"]) <= set(saved[True]["loss"])  # (health adds the rows' reductions)


def make_health_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="a")], name="m")
    model.compile(optimizer="sgd", loss="mse")
    return model


class InfIntoWeight(keras.callbacks.Callback):
    """An inf written into the head's kernel as training batch ``at`` starts (as an update leaves it)."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.at:
            kernel = self.model.get_layer("head").kernel
            kernel.assign(tf.tensor_scatter_nd_update(kernel, [[1, 2]], [np.inf]))


def test_a_weight_made_non_finite_before_a_step_is_named_with_the_layer_it_breaks(out_dir):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(5, name="hidden"), keras.layers.Dense(3, name="head")],
        name="mlp",
    )
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(48, 4)).astype("float32")
    hook = smd.KerasHook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    model.fit(x, x[:, :3], batch_size=8, shuffle=False, callbacks=[InfIntoWeight(3), hook], verbose=0)
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (3, "forward", "head/outputs")
    assert first["parameters"] == ["mlp/head/kernel"]
    assert "its own parameters were already non-finite as the step began (mlp/head/kernel)" in why(out_dir)
