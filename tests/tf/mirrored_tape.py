"""A custom training loop (hook.wrap_tape) under tf.distribute.MirroredStrategy on two logical CPU devices.

mirrored_tape.py OUT_DIR: one run per way to call the step ("eager", "traced") in OUT_DIR/<way>, and
OUT_DIR/<way>.npz: the kernel at the start of each batch and the first replica's loss of each batch.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 4)).astype("float32")
y = rng.normal(size=(32, 2)).astype("float32")


def run(way: str) -> None:
    out = os.path.join(sys.argv[1], way)
    hook = smd.KerasHook(
        out_dir=out,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "losses"],
    )
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="head")], name="mlp")
        optimizer = hook.wrap_optimizer(keras.optimizers.SGD(0.1))

    def step(xb, yb):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def distributed(xb, yb):
        return strategy.run(step, args=(xb, yb))

    if way == "traced":
        distributed = tf.function(distributed)
    kernels, losses = [], []
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    for xb, yb in strategy.experimental_distribute_dataset(data):
        kernels.append(model.get_layer("head").kernel.numpy())
        losses.append(strategy.experimental_local_results(distributed(xb, yb))[0].numpy())
    hook.close()
    np.savez(out + ".npz", kernels=np.array(kernels), losses=np.array(losses))


for way in ("eager", "traced"):
    run(way)
