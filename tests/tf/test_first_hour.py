"""A new user's first hour with the Keras hook: no built-in rule fires on a healthy run."""

import keras
import numpy as np
from support import assert_no_rule_fires
from tfmodels import make_model

import smdebug.tensorflow as smd


def test_no_builtin_rule_fires_on_a_healthy_run(out_dir):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0).astype("int64")  # 3 classes a small MLP learns
    hook = smd.KerasHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=4),
        include_collections=["weights", "biases", "gradients", "losses", "metrics"],
    )
    # learns within the 8 epochs; at 0.03 the validation loss of the last epochs edged over the training
    # loss by the overfit rule's 10% once the epochs' training logs were saved too (smdebug 1.0 does)
    model = make_model(optimizer=keras.optimizers.Adam(0.02))
    model.fit(x, y, epochs=8, batch_size=32, validation_split=0.25, callbacks=[hook], verbose=0)
    model.evaluate(x, y, batch_size=32, callbacks=[hook], verbose=0)
    hook.close()
    assert_no_rule_fires(out_dir)


def test_validation_logs_are_0d_like_the_training_ones(out_dir, data):
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    model = make_model()
    model.fit(x, y, epochs=1, batch_size=8, validation_split=0.25, callbacks=[hook], verbose=0)
    hook.close()
    trial = smd.create_trial(out_dir)
    for name in ("loss", "val_loss", "accuracy", "val_accuracy"):
        tensor = trial.tensor(name)
        assert tensor.value(tensor.steps()[-1]).shape == (), name
