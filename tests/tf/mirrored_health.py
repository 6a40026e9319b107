"""Keras fit with health=True under tf.distribute.MirroredStrategy on two logical CPU devices, a NaN in
the second replica's share of batch FAULT only (tests/tf/test_distributed.py).

mirrored_health.py OUT_DIR: one run per include_workers ("one", "all") in OUT_DIR/<include_workers>, and
each batch's loss in OUT_DIR/<include_workers>.losses.json.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402

FAULT = 3
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x = rng.normal(size=(48, 4)).astype("float32")
y = rng.normal(size=(48, 2)).astype("float32")
x[8 * FAULT + 6, 1] = np.nan  # a global batch of 8: the second replica gets its rows 4 to 7
for workers in ("one", "all"):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3, name="hidden"), keras.layers.Dense(2, name="head")],
            name="mlp",
        )
        model.compile(optimizer="sgd", loss="mse")
    hook = smd.KerasHook(
        out_dir=os.path.join(sys.argv[1], workers),
        health=True,
        include_workers=workers,
        include_collections=["inputs"],  # saved with the triggering step
    )
    means = []  # Keras' running mean of the epoch's loss after each batch
    logs = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs, m=means: m.append(logs["loss"]))
    model.fit(x, y, batch_size=8, shuffle=False, callbacks=[hook, logs], verbose=0)
    hook.close()
    batch_losses = [(b + 1) * m - b * (means[b - 1] if b else 0.0) for b, m in enumerate(means)]
    with open(os.path.join(sys.argv[1], f"{workers}.losses.json"), "w") as f:
        json.dump(batch_losses, f)
