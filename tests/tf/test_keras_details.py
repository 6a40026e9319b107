"""Keras behaviours smdebug 1.0's own TF 2 tests check: optimizer variables in GradientTape loops, the
`batch` metric, train logs at epoch end, save_scalar before fit, a truthy save_all, a subclassed model
built inside fit."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tfmodels import batches, make_model

import smdebug.tensorflow as smd
from smdebug import modes
from smdebug.trials import create_trial


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_optimizer_variables_saved_in_a_gradient_tape_loop(out_dir, data, traced):
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=2),
        include_collections=["optimizer_variables"],
    )
    model = make_model()
    optimizer = hook.wrap_optimizer(keras.optimizers.Adam(0.01))
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    def step(xb, yb):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            loss = loss_fn(yb, model(xb))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    if traced:
        step = tf.function(step)
    after = []  # the optimizer's variables once each step has applied its update
    for xb, yb in batches(x, y):
        step(tf.constant(xb), tf.constant(yb))
        after.append({v.path: v.numpy().copy() for v in optimizer.variables})
    hook.close()
    trial = create_trial(out_dir)
    names = trial.tensor_names(collection="optimizer_variables")
    assert any(n.endswith("/iteration") for n in names)
    assert any(n.endswith("head_kernel_momentum") for n in names)
    for name in names:
        assert trial.tensor(name).steps() == [0, 2]
        for step in (0, 2):
            np.testing.assert_array_equal(trial.tensor(name).value(step), after[step][name])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_the_variables_of_two_wrapped_optimizers_are_saved(out_dir, data, traced):
    # a loop with an optimizer per model (a GAN's generator and discriminator): both sets of variables
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["optimizer_variables"],
    )
    body, head = make_model(), make_model(seed=2)
    first = hook.wrap_optimizer(keras.optimizers.Adam(0.01))
    second = hook.wrap_optimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    def step(xb, yb):
        with hook.wrap_tape(tf.GradientTape(persistent=True)) as tape:
            one, two = loss_fn(yb, body(xb)), loss_fn(yb, head(xb))
        first.apply_gradients(zip(tape.gradient(one, body.trainable_variables), body.trainable_variables))
        second.apply_gradients(zip(tape.gradient(two, head.trainable_variables), head.trainable_variables))

    if traced:
        step = tf.function(step)
    after = []
    for xb, yb in batches(x, y):
        step(tf.constant(xb), tf.constant(yb))
        after.append({v.path: v.numpy().copy() for o in (first, second) for v in o.variables})
    hook.close()
    trial = create_trial(out_dir)
    names = trial.tensor_names(collection="optimizer_variables")
    assert sorted(names) == sorted(after[0])
    assert {n.split("/")[0].split("_")[0] for n in names} == {"adam", "sgd"}  # (adam_2: in one process)
    for name in names:
        assert trial.tensor(name).steps() == [0, 1, 2, 3]
        np.testing.assert_array_equal(trial.tensor(name).value(3), after[3][name])


def test_batch_metric_in_every_mode(out_dir, data):
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    model = make_model()
    model.fit(x, y, epochs=2, batch_size=8, validation_data=(x[:16], y[:16]), callbacks=[hook], verbose=0)
    model.evaluate(x, y, batch_size=16, callbacks=[hook], verbose=0)
    model.predict(x, batch_size=16, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert "batch" in trial.tensor_names(collection="metrics")
    batch = trial.tensor("batch")
    assert [int(batch.value(s, mode=modes.TRAIN)[0]) for s in batch.steps(mode=modes.TRAIN)] == [
        0,
        1,
        2,
        3,
    ] * 2
    # validation (2 batches, twice), evaluate (2 batches)
    assert [int(batch.value(s, mode=modes.EVAL)[0]) for s in batch.steps(mode=modes.EVAL)] == [0, 1] * 3
    assert [int(batch.value(s, mode=modes.PREDICT)[0]) for s in batch.steps(mode=modes.PREDICT)] == [0, 1]


def test_train_loss_and_metrics_saved_at_epoch_end_whatever_the_save_config(out_dir, data):
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=100))
    model = make_model()
    history = model.fit(x, y, epochs=2, batch_size=8, callbacks=[hook], verbose=0)
    later = tmp_run(out_dir)
    hook2 = smd.KerasHook(out_dir=later, save_config=smd.SaveConfig(save_interval=100))
    validated = make_model().fit(
        x, y, epochs=2, batch_size=8, validation_data=(x[:16], y[:16]), callbacks=[hook2], verbose=0
    )
    hook.close()
    hook2.close()
    for run, hist in ((out_dir, history), (later, validated)):
        trial = create_trial(run)
        # step 0 by the save config; each epoch's last training step (3, 7) for the epoch's logs
        for name in ("loss", "accuracy"):
            tensor = trial.tensor(name)
            assert tensor.steps(mode=modes.TRAIN) == [0, 3, 7]
            ends = [float(tensor.value(s, mode=modes.TRAIN)) for s in (3, 7)]
            np.testing.assert_allclose(ends, hist.history[name], rtol=1e-6)
    trial = create_trial(later)
    assert trial.tensor("val_loss").steps(mode=modes.EVAL) == [1, 3]  # each validation's last step
    np.testing.assert_allclose(
        [float(trial.tensor("val_loss").value(s, mode=modes.EVAL)) for s in (1, 3)],
        validated.history["val_loss"],
        rtol=1e-6,
    )


def tmp_run(out_dir):
    return out_dir.rstrip("/") + "_validated"


def test_save_scalar_and_save_tensor_before_fit_go_into_the_first_step(out_dir, data):
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=2))
    hook.save_scalar("lr", 0.5)
    hook.save_tensor("before", np.arange(3.0), "custom")
    model = make_model()
    model.fit(x, y, epochs=1, batch_size=8, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    # no GLOBAL step of their own before training; 3: the epoch's last step (its logs)
    assert trial.steps() == trial.steps(mode=modes.TRAIN) == [0, 2, 3]
    assert trial.tensor("scalar/lr").steps(mode=modes.TRAIN) == [0]
    assert trial.tensor("scalar/lr").value(0).item() == 0.5
    np.testing.assert_array_equal(trial.tensor("before").value(0, mode=modes.TRAIN), np.arange(3.0))
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == [0, 2, 3]  # training steps are not shifted


def test_save_all_takes_any_truthy_value(out_dir, data):
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_all=["true"], save_config=smd.SaveConfig(save_interval=3))
    assert hook.save_all is True
    make_model().fit(x, y, epochs=1, batch_size=8, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert {"mlp/head/kernel", "gradients/mlp/head/kernelGrad"} <= set(trial.tensor_names(step=0))


class Subclassed(keras.Model):
    """Built by its first call, inside fit; its own train_step."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(5, activation="relu")
        self.head = keras.layers.Dense(3, activation="softmax")

    def call(self, inputs):
        return self.head(self.hidden(inputs))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.losses.sparse_categorical_crossentropy(y, self(x, training=True))
            loss = tf.reduce_mean(loss)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def test_subclassed_model_built_inside_fit_saves_weights_and_gradients_at_step_0(out_dir, data):
    x, y = data
    keras.utils.set_random_seed(3)
    model = Subclassed()
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    hook = smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients"],
    )
    model.fit(x, y, epochs=1, batch_size=8, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    kernel = model.head.kernel.path
    assert trial.tensor(kernel).steps() == [0, 1, 2, 3]
    grad = trial.tensor(f"gradients/{kernel}Grad")
    assert grad.steps() == [0, 1, 2, 3]
    # the weights step 0 started from, its gradients, and the SGD update to step 1's weights
    np.testing.assert_allclose(
        trial.tensor(kernel).value(1),
        trial.tensor(kernel).value(0) - 0.1 * grad.value(0),
        rtol=1e-5,
        atol=1e-7,
    )


class MetricsDict(keras.Model):
    """Keras' own guide's custom train_step: it returns {m.name: m.result() for m in self.metrics}, where
    the compiled metrics' result is a dict ({"mae": ...} under "compile_metrics")."""

    def __init__(self):
        super().__init__()
        self.head = keras.layers.Dense(1)

    def call(self, x):
        return self.head(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def test_metrics_of_a_custom_train_step_returning_a_nested_dict(out_dir, data, caplog):
    x, _ = data
    y = x.sum(axis=1, keepdims=True)
    model = MetricsDict()
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=2))
    model.fit(x, y, epochs=1, batch_size=8, validation_data=(x, y), callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert "could not save" not in caplog.text
    assert trial.tensor_names(collection="metrics") == ["batch", "mae", "val_mae"]
    assert trial.tensor("mae").steps(mode=modes.TRAIN) == [0, 2, 3]  # saved steps, and the epoch's last
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == [0, 2, 3]
    # the validation's mean absolute error, as the model's metrics hold it after fit
    val_mae = trial.tensor("val_mae")
    assert val_mae.value(val_mae.steps()[-1]) == pytest.approx(float(model.get_metrics_result()["mae"]))


def test_end_step_0_turns_the_default_collections_off(out_dir, data):
    # the reference: the default collections (METRICS, LOSSES, SM_METRICS) are always saved; "to disable
    # the saving of these collections ... set end_step to 0 in the collection's SaveConfig"
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir, include_collections=["weights"], save_config=smd.SaveConfig(save_interval=1)
    )
    for name in ("metrics", "losses"):
        hook.get_collection(name).save_config = smd.SaveConfig(end_step=0)
    model = make_model()
    model.fit(x, y, epochs=2, batch_size=8, validation_data=(x[:16], y[:16]), callbacks=[hook], verbose=0)
    model.evaluate(x, y, batch_size=16, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.tensor_names() == ["mlp/head/kernel", "mlp/hidden/kernel"]
    assert trial.tensor("mlp/head/kernel").steps(mode=modes.TRAIN) == list(range(8))


def test_a_collection_ended_by_its_end_step_saves_no_later_epoch_logs(out_dir, data):
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    hook.get_collection("losses").save_config = smd.SaveConfig(save_interval=1, end_step=2)
    make_model().fit(x, y, epochs=2, batch_size=8, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == [0, 1]
    assert trial.tensor("accuracy").steps(mode=modes.TRAIN) == list(range(8))


def test_a_shared_layer_saves_its_last_calls_tensors_as_smdebug_1_0(out_dir):
    """A layer called twice in a step has one <layer>/inputs and <layer>/outputs: its last call's, as
    smdebug 1.0.34's TF 2 Keras hook keeps them (one InputOutputSaver per layer, overwritten each call)."""
    inp = keras.Input((3,))
    shared = keras.layers.Dense(2, name="shared")
    first, second = shared(inp), shared(inp * 0.0 + 5.0)
    model = keras.Model(inp, keras.layers.Dense(1, name="head")(keras.layers.Concatenate()([first, second])))
    model.compile("sgd", "mse")
    hook = smd.KerasHook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["layers"])
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 1), np.float32)
    kernel, bias = (w.numpy() for w in shared.weights)  # as the step's forward pass saw them
    model.fit(x, y, epochs=1, batch_size=4, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert sorted(n for n in trial.tensor_names() if n.startswith("shared/")) == [
        "shared/inputs",
        "shared/outputs",
    ]
    np.testing.assert_array_equal(trial.tensor("shared/inputs").value(0), np.full((4, 3), 5.0))
    expected = np.full((4, 3), 5.0, np.float32) @ kernel + bias  # the second call's output
    np.testing.assert_allclose(trial.tensor("shared/outputs").value(0), expected, rtol=1e-6)
