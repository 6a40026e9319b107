"""The built-in rules on Keras runs: offline on a finished run, and in-process (a firing rule stops fit)."""

import keras
import numpy as np
from tfmodels import make_model

import smdebug.tensorflow as smd
from smdebug.rules import create_rule, evaluate_rule
from smdebug.trials import create_trial


def _run(out_dir, data, lr, epochs=1, batch_size=8, collections=("gradients", "weights", "losses")):
    x, y = data
    hook = smd.KerasHook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=list(collections)
    )
    model = make_model(optimizer=keras.optimizers.SGD(lr))
    history = model.fit(
        x, y, epochs=epochs, batch_size=batch_size, shuffle=False, callbacks=[hook], verbose=0
    )
    hook.close()
    return hook, history


def _fired(out_dir, name, **params):
    rule = create_rule(name, create_trial(out_dir), **params)
    return evaluate_rule(rule)


def test_vanishing_gradient_reads_the_gradients(tmp_path, data):
    out = str(tmp_path / "run")
    _run(out, data, lr=0.1)
    assert _fired(out, "vanishing_gradient", threshold="1e-12") == []
    # every gradient's mean |g| is far below 10: with that threshold each step fires
    assert _fired(out, "vanishing_gradient", threshold="10") == [0, 1, 2, 3]


def test_loss_not_decreasing_on_a_model_that_does_not_learn(tmp_path, data):
    x, y = data
    out = str(tmp_path / "run")
    # one batch per epoch and a zero learning rate: Keras reports the same loss at every step
    _run(out, (x[:8], y[:8]), lr=0.0, epochs=8)
    fired = _fired(out, "loss_not_decreasing", num_steps="3")
    assert fired and fired[0] == 3


def test_exploding_tensor_stops_fit(tmp_path, data):
    x, y = data
    out = str(tmp_path / "run")
    hook = smd.KerasHook(
        out_dir=out, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"]
    )
    hook.add_rule("exploding_tensor", collection_names="weights")
    model = make_model(optimizer=keras.optimizers.SGD(1e30))
    x_big = x * 1e20
    history = model.fit(x_big, y, epochs=5, batch_size=8, callbacks=[hook], verbose=0)
    hook.close()
    assert hook.should_stop()
    assert [r.rule for r in hook.rule_results][:1] == ["ExplodingTensor"]
    # Keras stopped after the batch the rule fired on, far before 5 epochs of 4 batches
    stopped_at = hook.rule_results[0].step
    assert create_trial(out).steps()[-1] == stopped_at
    assert len(history.history["loss"]) == 1
    assert not np.isfinite(model.get_layer("head").kernel.numpy()).all()


def test_confusion_on_a_binary_classifier_with_one_sigmoid_output(tmp_path):
    # Keras' usual binary classifier: predictions of shape (batch, 1), each the probability of class 1
    out = str(tmp_path / "run")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 2)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="binary_crossentropy", metrics=["accuracy"])
    hook = smd.KerasHook(
        out_dir=out, save_config=smd.SaveConfig(save_interval=1), include_collections=["outputs", "losses"]
    )
    model.fit(x, y, epochs=8, batch_size=64, shuffle=False, callbacks=[hook], verbose=0)
    assert model.evaluate(x, y, verbose=0)[1] > 0.95
    model.optimizer.learning_rate.assign(0.0)  # the same predictions against the opposite labels
    model.fit(x, 1 - y, epochs=1, batch_size=64, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(out)
    assert trial.tensor("predictions").value(31).shape == (64, 1)
    rule = create_rule("confusion", trial)
    assert evaluate_rule(rule, start_step=28, end_step=32) == []  # right >95% of the time
    assert evaluate_rule(create_rule("confusion", trial), start_step=32) == [32, 33, 34, 35]  # all wrong
