"""KerasHook in model.fit / evaluate / predict on real tiny models, with and without XLA."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tfmodels import WeightsBefore, make_model, reference_gradients

import smdebug.tensorflow as smd
from smdebug.exceptions import SMDebugTypeError, TensorUnavailableForStep
from smdebug.trials import create_trial

EVERYTHING = ["weights", "biases", "gradients", "losses", "metrics", "outputs", "layers", "inputs"]
KERNELS = ["mlp/hidden/kernel", "mlp/head/kernel"]
BIASES = ["mlp/hidden/bias", "mlp/head/bias"]


def test_reference_example(out_dir, data):
    """saving-tensors-api / overview: KerasHook as a callback of fit and evaluate, then create_trial."""
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir)
    model = make_model()
    model.fit(x, y, epochs=2, batch_size=8, callbacks=[hook], verbose=0)
    model.evaluate(x, y, batch_size=8, callbacks=[hook], verbose=0)
    trial = smd.create_trial(out_dir=out_dir)
    # default collections only: losses and metrics (and smdebug 1.0's `batch`), at step 0 of each mode
    # (save_interval 500), and the epoch's training logs at the last step of each epoch
    assert set(trial.tensor_names()) == {"loss", "accuracy", "batch"}
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 3, 7]
    assert trial.steps(mode=smd.modes.EVAL) == [0]
    assert trial.tensor_names(collection="losses") == ["loss"]
    assert trial.tensor_names(collection="metrics") == ["accuracy", "batch"]
    assert (
        trial.tensor("loss").value(0, mode=smd.modes.TRAIN).shape == ()
    )  # a 0-d tensor, as Keras returns it
    assert smd.Hook is smd.KerasHook


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_collections_steps_and_modes(out_dir, data, jit):
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=2), include_collections=EVERYTHING
    )
    model = make_model(jit_compile=jit)
    model.fit(x, y, epochs=1, batch_size=8, shuffle=False, callbacks=[hook], verbose=0)
    model.evaluate(x, y, batch_size=16, callbacks=[hook], verbose=0)
    model.predict(x, batch_size=16, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.tensor_names(collection="weights") == sorted(KERNELS)
    assert trial.tensor_names(collection="biases") == sorted(BIASES)
    assert trial.tensor_names(collection="gradients") == sorted(
        f"gradients/{n}Grad" for n in KERNELS + BIASES
    )
    assert trial.tensor_names(collection="losses") == ["loss"]
    assert trial.tensor_names(collection="metrics") == ["accuracy", "batch"]
    assert trial.tensor_names(collection="outputs") == ["labels", "predictions"]
    assert trial.tensor_names(collection="inputs") == ["model_input"]
    assert trial.tensor_names(collection="layers") == [
        "head/inputs",
        "head/outputs",
        "hidden/inputs",
        "hidden/outputs",
    ]
    # 4 train steps (the last one: the epoch's logs), 2 eval steps, 2 predict steps; global steps count
    # across modes
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 2, 3]
    assert trial.steps(mode=smd.modes.EVAL) == [0]
    assert trial.steps(mode=smd.modes.PREDICT) == [0]
    assert trial.steps() == [0, 2, 3, 4, 6]
    # gradients only in training; the model's inputs and labels are the batch fed at that step
    assert trial.tensor("gradients/mlp/head/kernelGrad").steps(mode=smd.modes.EVAL) == []
    np.testing.assert_array_equal(trial.tensor("model_input").value(2, mode=smd.modes.TRAIN), x[16:24])
    np.testing.assert_array_equal(trial.tensor("labels").value(0, mode=smd.modes.EVAL), y[:16])
    np.testing.assert_array_equal(trial.tensor("model_input").value(0, mode=smd.modes.PREDICT), x[:16])
    predictions = trial.tensor("predictions").value(0, mode=smd.modes.PREDICT)
    np.testing.assert_allclose(predictions, model.predict(x[:16], verbose=0), rtol=1e-5, atol=1e-6)
    # the hidden layer's output is relu(x W + b) of the model at that step
    hidden = trial.tensor("hidden/outputs").value(0, mode=smd.modes.EVAL)
    expected = model.get_layer("hidden")(x[:16]).numpy()
    np.testing.assert_allclose(hidden, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_gradients_equal_an_independent_gradient_tape(out_dir, data, jit):
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["gradients", "weights", "biases", "outputs"],
    )
    before = WeightsBefore()
    model = make_model(jit_compile=jit, optimizer=keras.optimizers.SGD(0.5))
    model.fit(x, y, epochs=1, batch_size=8, shuffle=False, callbacks=[before, hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3]
    for step in (0, 3):  # the first step and one after three updates
        xb, yb = x[step * 8 : step * 8 + 8], y[step * 8 : step * 8 + 8]
        expected, reference = reference_gradients(before.at[step], xb, yb)
        for path, grad in expected.items():
            saved = trial.tensor(f"gradients/{path}Grad").value(step)
            np.testing.assert_allclose(saved, grad, rtol=1e-4, atol=1e-6)
            # the weights saved at a step are those this step's gradients were computed with
            np.testing.assert_array_equal(
                trial.tensor(path).value(step), before.at[step][_index(model, path)]
            )
        np.testing.assert_allclose(
            trial.tensor("predictions").value(step), reference(xb).numpy(), rtol=1e-5, atol=1e-6
        )
    # and the gradients did move the weights: they are not the same at steps 0 and 3
    assert not np.allclose(trial.tensor("mlp/head/kernel").value(0), trial.tensor("mlp/head/kernel").value(3))


def _index(model, path):
    return [v.path for v in model.trainable_variables].index(path)


def test_steps_with_nothing_due_run_keras_own_function(out_dir, data):
    """Zero cost: only due steps swap in the instrumented function, and Keras' own one is back after."""
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=3),
        include_collections=["gradients", "layers"],
    )
    model = make_model()
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(self.model.train_function)

    model.fit(x, y, epochs=1, batch_size=8, callbacks=[hook, Spy()], verbose=0)
    plain = model.train_function
    assert [f is plain for f in seen] == [False, True, True, False]  # due at steps 0 and 3
    hook.close()
    trial = create_trial(out_dir)
    assert trial.tensor("gradients/mlp/head/kernelGrad").steps() == [0, 3]
    assert trial.tensor("hidden/outputs").steps() == [0, 3]
    # the model is left as it was: no wrapped call on its layers
    assert all("call" not in vars(layer) for layer in model.layers)


def test_set_mode_modes_and_validation(out_dir, data):
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    model = make_model()
    model.fit(x, y, epochs=2, batch_size=16, validation_data=(x[:8], y[:8]), callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2, 3]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 1]
    # validation results of each epoch go with that epoch's validation step, as smdebug 1.0 saves them
    assert trial.tensor_names(collection="losses") == ["loss", "val_loss"]
    assert trial.tensor_names(collection="metrics") == ["accuracy", "batch", "val_accuracy"]
    assert trial.tensor("val_loss").steps(mode=smd.modes.EVAL) == [0, 1]
    # the hook's mode follows Keras: set_mode before fit is overridden by fit itself
    hook2 = smd.KerasHook(out_dir=out_dir + "2", save_config=smd.SaveConfig(save_interval=1))
    hook2.set_mode(smd.modes.EVAL)
    assert hook2.mode == smd.modes.EVAL
    model.fit(x, y, epochs=1, batch_size=32, callbacks=[hook2], verbose=0)
    assert hook2.mode == smd.modes.TRAIN


def test_optimizer_variables_and_reductions(out_dir, data):
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"], save_raw_tensor=True),
        include_collections=["optimizer_variables", "weights"],
    )
    model = make_model(optimizer="adam")
    model.fit(x, y, epochs=1, batch_size=16, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    names = trial.tensor_names(collection="optimizer_variables")
    prefix = model.optimizer.name  # "adam", or "adam_1"... when other Adam optimizers came first
    assert f"{prefix}/iteration" in names
    assert f"{prefix}/mlp_head_kernel_momentum" in names
    # the iteration counter after each update
    assert [int(trial.tensor(f"{prefix}/iteration").value(s)) for s in (0, 1)] == [1, 2]
    kernel = trial.tensor("mlp/head/kernel")
    raw = kernel.value(1)
    assert kernel.reduction_value(1, "mean") == pytest.approx(raw.mean(), rel=1e-5)
    assert kernel.reduction_value(1, "max") == pytest.approx(raw.max(), rel=1e-6)
    assert kernel.reduction_value(1, "l2") == pytest.approx(np.sqrt((raw**2).sum()), rel=1e-5)


def test_loss_scale_optimizer_gradients_are_unscaled(out_dir, data):
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_steps=[0]), include_collections=["gradients"]
    )
    before = WeightsBefore()
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1024.0)
    model = make_model(optimizer=optimizer)
    model.fit(x, y, epochs=1, batch_size=8, shuffle=False, callbacks=[before, hook], verbose=0)
    hook.close()
    expected, _ = reference_gradients(before.at[0], x[:8], y[:8])
    trial = create_trial(out_dir)
    for path, grad in expected.items():
        np.testing.assert_allclose(trial.tensor(f"gradients/{path}Grad").value(0), grad, rtol=1e-4, atol=1e-6)


def test_add_keras_layer_and_custom_collections(out_dir, data):
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    model = make_model()
    hook.get_collection("head_only").add_keras_layer(model.get_layer("head"), inputs=True, outputs=True)
    hook.get_collection("hidden_kernel").add(model.get_layer("hidden").kernel)
    hook.get_collection("my_regex").include("^gradients/mlp/hidden/bias")
    hook.include_collections = [*hook.include_collections, "head_only", "hidden_kernel", "my_regex"]
    model.fit(x, y, epochs=1, batch_size=16, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.tensor_names(collection="head_only") == ["head/inputs", "head/outputs"]
    assert trial.tensor_names(collection="hidden_kernel") == ["mlp/hidden/kernel"]
    assert trial.tensor_names(collection="my_regex") == ["gradients/mlp/hidden/biasGrad"]
    assert "hidden/outputs" not in trial.tensor_names()


def test_layers_of_several_tensors_are_in_the_layers_collection(out_dir, data):
    # a Concatenate (or Add) layer takes a list: its inputs are saved as cat/inputs_0, cat/inputs_1
    x, y = data
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    left = keras.layers.Dense(2, name="left")(inputs)
    right = keras.layers.Dense(3, name="right")(inputs)
    outputs = keras.layers.Dense(3, name="out")(keras.layers.Concatenate(name="cat")([left, right]))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hook = smd.KerasHook(
        out_dir=out_dir, include_collections=["layers"], save_config=smd.SaveConfig(save_interval=1)
    )
    model.fit(x, y, epochs=1, batch_size=16, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    layers = trial.tensor_names(collection="layers")
    assert {"cat/inputs_0", "cat/inputs_1", "cat/outputs"} <= set(layers)
    assert trial.tensor("cat/inputs_0").steps() == [0, 1]
    np.testing.assert_array_equal(
        trial.tensor("cat/outputs").value(1),
        np.concatenate(
            [trial.tensor("cat/inputs_0").value(1), trial.tensor("cat/inputs_1").value(1)], axis=1
        ),
    )


def test_save_scalar_save_tensor_and_add_to_collection(out_dir, data):
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    model = make_model()

    class Extra(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            hook.save_tensor("kernel_copy", model.get_layer("head").kernel, "custom")
            hook.save_tensor("twice", tf.constant([1.0, 2.0]) * 2, ["custom"])

    model.fit(x, y, epochs=1, batch_size=16, callbacks=[Extra(), hook], verbose=0)
    hook.save_scalar("lr", tf.constant(0.5), sm_metric=True)
    hook.save_tensor("numpy_array", np.arange(3), "custom")
    hook.add_to_collection("custom", "not_saved_yet")
    hook.close()
    trial = create_trial(out_dir)
    assert {"kernel_copy", "twice", "numpy_array"} <= set(trial.tensor_names(collection="custom"))
    np.testing.assert_array_equal(trial.tensor("twice").value(1), [2.0, 4.0])
    lr = trial.tensor("scalar/lr")
    assert lr.value(lr.steps()[-1]).tolist() == [0.5]  # shape (1,), as smdebug 1.0 saves a TF scalar
    assert "not_saved_yet" in hook.get_collection("custom").tensor_names


def test_save_scalar_of_a_tensor_without_a_value_is_a_clear_error(out_dir):
    hook = smd.KerasHook(out_dir=out_dir)

    @tf.function(autograph=False)  # (autograph would wrap the error in its own)
    def step(v):
        hook.save_scalar("traced", v * 2)  # a symbolic tensor while the function is traced
        return v

    with pytest.raises(SMDebugTypeError) as raised:
        step(tf.constant(1.0))
    assert "save_scalar('traced')" in str(raised.value) and "symbolic" in str(raised.value)
    hook.save_scalar("eager", tf.constant(2.0))  # with a value: saved
    hook.close()
    assert create_trial(out_dir).tensor_names() == ["scalar/eager"]


def test_save_tensor_of_a_tensor_without_a_value_is_a_clear_error(out_dir):
    hook = smd.KerasHook(out_dir=out_dir)
    variable = tf.Variable([1.0, 2.0])

    @tf.function(autograph=False)  # (autograph would wrap the error in its own)
    def step(v):
        hook.save_tensor("traced", v * 2, "custom")  # a symbolic tensor while the function is traced
        return v

    @tf.function(autograph=False)
    def read():
        hook.save_tensor("variable", variable, "custom")  # a variable has no value while traced either

    for function, name in ((lambda: step(tf.constant(1.0)), "traced"), (read, "variable")):
        with pytest.raises(SMDebugTypeError) as raised:
            function()
        assert f"save_tensor({name!r})" in str(raised.value) and "symbolic" in str(raised.value)
    hook.save_tensor("eager", variable, "custom")  # with a value: saved
    hook.close()
    trial = create_trial(out_dir)
    assert trial.tensor_names() == ["eager"]
    np.testing.assert_array_equal(trial.tensor("eager").value(0), [1.0, 2.0])


def test_json_configuration(tmp_path, data):
    x, y = data
    config = tmp_path / "hook.json"
    config.write_text(
        '{"LocalPath": "%s", "HookParameters": {"save_interval": "2"},'
        ' "CollectionConfigurations": [{"CollectionName": "gradients"},'
        ' {"CollectionName": "weights", "CollectionParameters": {"save_steps": "1"}}]}' % (tmp_path / "run")
    )
    hook = smd.KerasHook.create_from_json_file(str(config))
    make_model().fit(x, y, epochs=1, batch_size=8, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("gradients/mlp/head/kernelGrad").steps() == [0, 2]
    assert trial.tensor("mlp/head/kernel").steps() == [0, 1, 2]  # save_steps joins the interval
    assert trial.tensor("loss").steps() == [0, 2, 3]  # 3: the epoch's logs


def test_estimator_hook_says_what_to_use_instead():
    with pytest.raises(NotImplementedError, match="KerasHook.*SessionHook"):
        smd.EstimatorHook(out_dir="/nonexistent")


def test_predict_only_model_and_run_eagerly(out_dir, data):
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=EVERYTHING
    )
    model = make_model()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", run_eagerly=True)
    model.fit(x, y, epochs=1, batch_size=16, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.tensor("gradients/mlp/head/kernelGrad").steps() == [0, 1]
    assert trial.tensor("head/outputs").steps() == [0, 1]


def test_subclassed_model_with_two_outputs(out_dir):
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(4, activation="tanh", name="sub_hidden")
            self.out = keras.layers.Dense(2, name="sub_out")

        def call(self, x):
            h = self.hidden(x)
            return {"out": self.out(h), "hid": h}

    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    hook = smd.KerasHook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=EVERYTHING
    )
    model = Net()  # built by its first call, after the hook has seen it
    model.compile(optimizer="adam", loss={"out": "mse", "hid": "mse"}, jit_compile=True)
    model.fit(
        x, {"out": np.zeros((16, 2)), "hid": np.ones((16, 4))}, batch_size=8, callbacks=[hook], verbose=0
    )
    hook.close()
    trial = create_trial(out_dir)
    assert trial.tensor_names(collection="losses") == ["hid_loss", "loss", "out_loss"]
    assert trial.tensor_names(collection="outputs") == [
        "labels_0",
        "labels_1",
        "predictions_0",
        "predictions_1",
    ]
    assert trial.tensor_names(collection="weights") == ["net/sub_hidden/kernel", "net/sub_out/kernel"]
    assert "gradients/net/sub_out/kernelGrad" in trial.tensor_names(collection="gradients")
    assert trial.tensor("sub_hidden/outputs").value(1).shape == (8, 4)


def test_save_all_and_reductions_without_the_raw_tensor(out_dir, data):
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir,
        save_all=True,
        save_config=smd.SaveConfig(save_steps=[1], save_interval=100),
        reduction_config=smd.ReductionConfig(reductions=["min"], abs_reductions=["mean"], norms=["l1"]),
    )
    before = WeightsBefore()
    model = make_model(optimizer="adam", jit_compile=True)
    model.fit(x, y, epochs=1, batch_size=8, shuffle=False, callbacks=[before, hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    names = set(trial.tensor_names())
    expected = {"mlp/hidden/kernel", "gradients/mlp/hidden/kernelGrad", "hidden/outputs", "head/inputs"}
    expected |= {
        "predictions",
        "labels",
        "model_input",
        "loss",
        "accuracy",
        f"{model.optimizer.name}/iteration",
    }
    assert expected <= names
    kernel = trial.tensor("mlp/hidden/kernel")
    with pytest.raises(TensorUnavailableForStep):
        kernel.value(1)  # only reductions were saved
    start = before.at[1][0]
    assert kernel.reduction_value(1, "min") == pytest.approx(start.min(), rel=1e-6)
    assert kernel.reduction_value(1, "mean", abs=True) == pytest.approx(np.abs(start).mean(), rel=1e-5)
    assert kernel.reduction_value(1, "l1") == pytest.approx(np.abs(start).sum(), rel=1e-5)
    # losses and metrics are saved as they are, whatever the reduction configuration
    assert trial.tensor("loss").value(1).shape == ()


def test_steps_per_execution_warns_and_saves_what_it_can(out_dir, data, caplog_smdebug):
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=EVERYTHING
    )
    model = make_model()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", steps_per_execution=2)
    model.fit(x, y, epochs=1, batch_size=8, callbacks=[hook], verbose=0)
    hook.close()
    warnings = [r.getMessage() for r in caplog_smdebug.records if "steps_per_execution=2" in r.getMessage()]
    assert len(warnings) == 1 and "not captured" in warnings[0]
    trial = create_trial(out_dir)
    assert trial.steps() == [0, 1]  # one smdebug step per execution of two batches
    assert {"loss", "mlp/head/kernel"} <= set(trial.tensor_names())
    assert trial.tensor_names(collection="gradients") == []


def test_a_saved_variable_is_its_value_when_saved(out_dir):
    hook = smd.KerasHook(out_dir=out_dir)
    variable = tf.Variable([1.0, 2.0])
    hook.save_tensor("v", variable, "custom")
    variable.assign([5.0, 6.0])  # before the writer has written it
    variable.assign_add([1.0, 1.0])
    hook.close()
    np.testing.assert_array_equal(create_trial(out_dir).tensor("v").value(0), [1.0, 2.0])


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_what_each_step_computes_follows_its_due_collections(out_dir, data, jit):
    """Collections due at different steps, with different reduction configurations: each step's compiled
    function computes what that step saves (reductions in the step, raw values), also for layer tensors
    whose batch dimension is known only when the step runs."""
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=100))
    hook.get_collection("weights").save_config = smd.SaveConfig(save_interval=2)  # 0, 2
    hook.get_collection("gradients").save_config = smd.SaveConfig(save_interval=1, start_step=1, end_step=3)
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(reductions=["max"], norms=["l2"])
    layers = hook.get_collection("layers")
    layers.save_config = smd.SaveConfig(save_interval=1, start_step=2)  # 2, 3
    layers.reduction_config = smd.ReductionConfig(reductions=["mean", "median"], save_raw_tensor=True)
    hook.include_collections = ["weights", "gradients", "layers", "losses"]
    before = WeightsBefore()
    model = make_model(jit_compile=jit)
    model.fit(x, y, epochs=1, batch_size=8, shuffle=False, callbacks=[before, hook], verbose=0)
    hook.close()
    trial = create_trial(out_dir)
    kernel, grad = trial.tensor("mlp/hidden/kernel"), trial.tensor("gradients/mlp/hidden/kernelGrad")
    outputs = trial.tensor("hidden/outputs")
    assert kernel.steps() == [0, 2] and grad.steps() == [1, 2] and outputs.steps() == [2, 3]
    for step in (0, 2):
        np.testing.assert_array_equal(kernel.value(step), before.at[step][0])
    for step in (1, 2):
        with pytest.raises(TensorUnavailableForStep):
            grad.value(step)  # reductions only
        assert set(grad.reduction_values(step)) == {("max", False), ("l2", False)}
    for step in (2, 3):
        raw = outputs.value(step)
        assert raw.shape == (8, 5)
        np.testing.assert_allclose(outputs.reduction_value(step, "mean"), raw.mean(), rtol=1e-5)
        np.testing.assert_allclose(outputs.reduction_value(step, "median"), np.median(raw), rtol=1e-5)
    np.testing.assert_allclose(
        trial.tensor("head/inputs").value(3), outputs.value(3), rtol=1e-6
    )  # the head's input is the hidden layer's output
