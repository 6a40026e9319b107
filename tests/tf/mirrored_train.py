"""Keras fit under tf.distribute.MirroredStrategy on two logical CPU devices, with a KerasHook.

Run as a script (devices must be configured before TensorFlow starts): mirrored_train.py OUT_DIR WORKERS,
WORKERS the hook's include_workers (one, all).
Writes OUT_DIR.weights.npz: the trainable weights at the start of each training step.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
from tfmodels import WeightsBefore, make_model  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402

out = sys.argv[1]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 4)).astype("float32")
y = rng.integers(0, 3, size=(32,))
hook = smd.KerasHook(
    out_dir=out,
    save_config=smd.SaveConfig(save_interval=1),
    include_collections=["gradients", "weights", "layers", "losses", "outputs"],
    include_workers=sys.argv[2],
)
with strategy.scope():
    model = make_model(optimizer=keras.optimizers.SGD(0.5))
before = WeightsBefore()
model.fit(x, y, batch_size=16, epochs=1, shuffle=False, callbacks=[before, hook], verbose=0)
hook.close()
paths = [v.path for v in model.trainable_variables]
np.savez(
    out + ".weights.npz", **{f"{step}:{p}": w for step, ws in enumerate(before.at) for p, w in zip(paths, ws)}
)
print(strategy.num_replicas_in_sync)
