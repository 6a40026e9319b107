"""A new user's first hour with the MXNet hook: no built-in rule fires on a healthy run."""

import subprocess
import sys
import textwrap

import mxnet as mx
import numpy as np
from conftest import make_net
from mxnet import autograd, gluon
from support import assert_no_rule_fires

import smdebug.mxnet as smd
from smdebug.trials import create_trial


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


def test_hybridize_after_register_block_warns_nothing(tmp_path):
    """MXNet's 8-line UserWarning about hooks on a block hybridized afterwards: the plugin captures
    hybridized blocks itself, so the user sees nothing."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import mxnet as mx
            from mxnet import autograd, gluon
            import smdebug.mxnet as smd

            net = gluon.nn.HybridSequential()
            net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
            net.initialize()
            loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
            hook = smd.Hook({str(tmp_path / "run")!r}, save_config=smd.SaveConfig(save_interval=1),
                            include_collections=["weights", "gradients", "losses"])
            hook.register_block(net)
            net.hybridize()
            for _ in range(2):
                with autograd.record():
                    loss = loss_fn(net(mx.nd.ones((4, 5))), mx.nd.array([0, 1, 2, 0]))
                loss.backward()
            hook.close()
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-W", "default::UserWarning", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "is being hybridized" not in done.stderr, done.stderr
    assert create_trial(str(tmp_path / "run")).steps() == [0, 1]
