"""A new user's first hour with the MXNet hook: no built-in rule fires on a healthy run."""

import mxnet as mx
import numpy as np
from conftest import make_net
from mxnet import autograd, gluon
from support import assert_no_rule_fires

import smdebug.mxnet as smd


def test_no_builtin_rule_fires_on_a_healthy_run(out_dir):
    net, loss_fn = make_net()
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=4),
        include_collections=["weights", "biases", "gradients", "losses"],
    )
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.03})
    rng = np.random.RandomState(0)
    x = rng.randn(256, 5).astype("float32")
    y = (x[:, 0] > 0).astype("float32") + (x[:, 1] > 0)  # 3 classes the MLP learns
    for _ in range(4):
        for start in range(0, 256, 32):
            data, label = mx.nd.array(x[start : start + 32]), mx.nd.array(y[start : start + 32])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(32)
    hook.close()
    assert_no_rule_fires(out_dir)
