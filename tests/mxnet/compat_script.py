"""One training script for both libraries: run it with the real smdebug 1.0.34 or with ours.

python compat_script.py OUT_DIR SCENARIO     (imports smdebug.mxnet from whichever smdebug is installed)
"""

import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import smdebug.mxnet as smd

out_dir, scenario = sys.argv[1], sys.argv[2]
mx.random.seed(0)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
net.initialize(mx.init.Xavier())
if scenario.endswith("-hybrid"):
    net.hybridize()
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
rng = np.random.RandomState(1)
data = [(mx.nd.array(rng.randn(4, 5)), mx.nd.array(rng.randint(0, 3, 4))) for _ in range(8)]

every_step = smd.SaveConfig(save_interval=1)
if scenario == "train":
    hook = smd.Hook(
        out_dir,
        save_config=every_step,
        include_collections=["weights", "biases", "gradients", "losses", "first_layer"],
        include_regex=["dense1_output_"],
    )
    hook.get_collection("first_layer").add_block_tensors(net[0], inputs=True, outputs=True)
elif scenario == "reductions":
    reductions = smd.ReductionConfig(reductions=["mean", "max"], abs_reductions=["min"], norms=["l2"])
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=2),
        reduction_config=reductions,
        include_collections=["weights", "gradients", "losses"],
    )
elif scenario == "modes":
    hook = smd.Hook(out_dir, save_config=every_step, include_collections=["weights", "gradients", "losses"])
else:  # "all", "all-hybrid"
    hook = smd.Hook(out_dir, save_config=every_step, save_all=True)
hook.register_block(net)
hook.register_block(loss_fn)
# save_tensor values are saved when the next step starts (before training: the first step). Not with
# reductions: 1.0.34 saves a save_tensor value raw or not at all, ours saves the collection's reductions.
if scenario != "reductions":
    hook.save_tensor("before_training", mx.nd.array([1.0, 2.0, 3.0]))
if scenario == "train":
    hook.save_scalar("learning_rate", 0.1)  # before training: into the first step


def train(batches):
    for x, y in batches:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(4)
        if scenario == "train":  # scalars are cached until the step's end by 1.0.34; saved steps agree
            hook.save_scalar("mean_loss", float(loss.mean().asscalar()))
            # saved at the next step (after the last step: 1.0.34 drops it, the run records it unsaved)
            hook.save_tensor("batch_loss", loss)  # (into a new collection 1.0.34 crashes)


hook.set_mode(smd.modes.TRAIN)
if scenario == "modes":
    train(data[:3])
    hook.set_mode(smd.modes.EVAL)
    for x, y in data[3:5]:
        loss_fn(net(x), y)
    hook.set_mode(smd.modes.TRAIN)
    train(data[5:7])
    hook.set_mode(smd.modes.EVAL)
    loss_fn(net(data[7][0]), data[7][1])
else:
    train(data[:5])
hook.close()
