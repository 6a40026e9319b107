"""A TF 1.x graph trained by a MonitoredTrainingSession with a SessionHook (tests/tf/test_session.py).

python graph_train.py OUT_DIR [CONFIG_JSON]: the hook from its arguments, or from the JSON configuration.
Prints, as JSON, what the script's own run calls fetched and which steps asked for more fetches.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()

import smdebug.tensorflow as smd  # noqa: E402

LR, MOMENTUM = 0.1, 0.9

out_dir = sys.argv[1]
if len(sys.argv) > 2:
    hook = smd.SessionHook.create_from_json_file(sys.argv[2])
else:
    hook = smd.SessionHook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_steps=[0, 1, 2, 3, 5]),
        reduction_config=smd.ReductionConfig(reductions=["mean"], norms=["l2"], save_raw_tensor=True),
        include_collections=[
            "weights",
            "biases",
            "gradients",
            "losses",
            "metrics",
            "optimizer_variables",
            "custom",
        ],
    )

rng = np.random.default_rng(0)
xs = rng.normal(size=(16, 3)).astype("float32")
ys = rng.normal(size=(16, 1)).astype("float32")
x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
w = tf.compat.v1.get_variable("dense/kernel", [3, 1], initializer=tf.compat.v1.initializers.constant(0.5))
b = tf.compat.v1.get_variable("dense/bias", [1], initializer=tf.compat.v1.zeros_initializer())
pred = tf.add(tf.matmul(x, w), b, name="pred")
loss = tf.compat.v1.losses.mean_squared_error(y, pred)
hidden = tf.nn.relu(pred, name="relu_out")
mae = tf.reduce_mean(tf.abs(pred - y), name="mae")
scaled = tf.multiply(pred, 2.0, name="scaled")
hook.get_collection("custom").add(hidden)  # a tf.Tensor
hook.get_collection("custom").add(scaled.op)  # a tf.Operation: its outputs
hook.add_to_collection("metrics", mae)
optimizer = hook.wrap_optimizer(tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM))
train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
nothing = tf.constant(1.0, name="nothing")

asked = []  # per run call: did the hook ask it to fetch more
own_before_run = hook.before_run


def before_run(run_context):
    args = own_before_run(run_context)
    asked.append(args is not None)
    return args


hook.before_run = before_run

fetched = {"TRAIN": [], "EVAL": []}
feed = {x: xs, y: ys}
with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
    hook.set_mode(smd.modes.TRAIN)
    for _ in range(5):  # TRAIN steps 0-4
        _, *values = sess.run([train_op, loss, hidden, mae, scaled], feed_dict=feed)
        fetched["TRAIN"].append([np.asarray(v).tolist() for v in values])
    sess.run(nothing)  # TRAIN step 5: nothing fed, the placeholders' tensors cannot be fetched
    hook.set_mode(smd.modes.EVAL)
    for _ in range(2):  # EVAL steps 0-1
        values = sess.run([loss, hidden, mae, scaled], feed_dict=feed)
        fetched["EVAL"].append([np.asarray(v).tolist() for v in values])
print(json.dumps({"fetched": fetched, "asked": asked, "xs": xs.tolist(), "ys": ys.tolist()}))
