"""Zero code change: an unmodified Gluon script, run in a subprocess with a hook configuration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from smdebug.trials import create_trial

TRAIN = textwrap.dedent(
    """
    import json
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon

    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    HYBRIDIZE
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    rng = np.random.RandomState(1)
    losses, weights = [], []
    scale = gluon.nn.HybridLambda(lambda F, x: x * 0.5)  # a parameterless block called before the model
    for step in range(4):
        x, y = scale(mx.nd.array(rng.randn(4, 5))), mx.nd.array(rng.randint(0, 3, 4))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(4)
        losses.append(loss.asnumpy().tolist())
        weights.append(net[1].weight.data().asnumpy().tolist())
    print(json.dumps([losses, weights]))
    """
)


def _run(tmp_path, config, hybridize=False, own=""):
    script = tmp_path / "train.py"
    script.write_text(TRAIN.replace("HYBRIDIZE", ("net.hybridize()\n" if hybridize else "") + own))
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k not in ("SMDEBUG_DISABLE", "USE_SMDEBUG")}
    env["SMDEBUG_CONFIG_FILE_PATH"] = str(path)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_unmodified_script_is_hooked_on_import(tmp_path):
    out = tmp_path / "run"
    config = {
        "LocalPath": str(out),
        "HookParameters": {"save_interval": "2"},
        "CollectionConfigurations": [{"CollectionName": "weights"}, {"CollectionName": "gradients"}],
    }
    (losses, weights), _ = _run(tmp_path, config)

    trial = create_trial(str(out))
    assert trial.steps() == [0, 2]
    assert sorted(trial.tensor_names(collection="weights")) == ["dense0_weight", "dense1_weight"]
    assert "gradient/dense1_bias" in trial.tensor_names(collection="gradients")
    loss = trial.tensor("softmaxcrossentropyloss0_output_0")  # losses: always saved
    for step in (0, 2):
        np.testing.assert_allclose(loss.value(step), losses[step], rtol=1e-6)
        np.testing.assert_allclose(trial.tensor("dense1_weight").value(step), weights[step], rtol=1e-6)


def test_unmodified_hybridized_script_saves_its_layers(tmp_path):
    out = tmp_path / "run"
    config = {"LocalPath": str(out), "HookParameters": {"save_interval": "1", "include_regex": "dense0_.*"}}
    (losses, _), stderr = _run(tmp_path, config, hybridize=True)

    trial = create_trial(str(out))
    assert trial.steps() == [0, 1, 2, 3]
    names = set(trial.tensor_names(collection="default"))
    assert {"dense0_input_0", "dense0_output_0", "dense0_weight", "gradient/dense0_bias"} <= names
    assert trial.tensor("dense0_output_0").value(3).shape == (4, 8)
    assert "Traceback" not in stderr


def test_a_script_with_its_own_hook_is_not_captured_twice(tmp_path):
    """The script makes and registers a hook of its own: it decides, the activated hook saves nothing."""
    auto, mine = tmp_path / "auto", tmp_path / "mine"
    own = (
        "import smdebug.mxnet as smd\n"
        f"hook = smd.Hook(out_dir={str(mine)!r}, save_config=smd.SaveConfig(save_interval=1), "
        "include_collections=['weights'])\n"
        "hook.register_block(net)\n"
    )
    config = {"LocalPath": str(auto), "HookParameters": {"save_interval": "1"}}
    _run(tmp_path, config, own=own)
    assert create_trial(str(mine)).steps() == [0, 1, 2, 3]
    assert not (auto / "index").exists()
