"""Zero code change: an unmodified Keras script (no smdebug import) produces a readable run once a hook
configuration is present, under SMDEBUG_CONFIG_FILE_PATH and under `smdebug run`, in real subprocesses that
start through the core's startup file."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from smdebug import modes
from smdebug.trials import create_trial

SMDEBUG_CLI = str(Path(sys.executable).with_name("smdebug"))

# A training script that knows nothing of smdebug; it prints the loss Keras reports after each epoch.
TRAIN = textwrap.dedent(
    """
    import json
    IMPORTS
    import numpy as np

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = rng.integers(0, 3, size=(32,))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=JIT)
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    model.evaluate(x, y, batch_size=16, verbose=0)
    model.predict(x, batch_size=16, verbose=0)
    print(json.dumps(history.history["loss"]))
    """
)


def _script(tmp_path, imports="import keras", jit=False) -> str:
    path = tmp_path / "train.py"
    path.write_text(TRAIN.replace("IMPORTS", imports).replace("JIT", str(jit)))
    return str(path)


def _run(args, env_extra, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMDEBUG")}
    env.update(env_extra, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _config(tmp_path, out_dir, collections=("weights", "gradients", "layers")) -> str:
    config = {
        "LocalPath": out_dir,
        "HookParameters": {"save_interval": "2"},
        "CollectionConfigurations": [{"CollectionName": c} for c in collections]
        + [{"CollectionName": "losses", "CollectionParameters": {"save_interval": "1"}}],
    }
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(
    "imports,jit",
    [("import keras", False), ("import tensorflow as tf\nkeras = tf.keras", True)],
    ids=["import-keras", "import-tensorflow-xla"],
)
def test_unmodified_script_with_a_config_file(tmp_path, imports, jit):
    out_dir = str(tmp_path / "run")
    script = _script(tmp_path, imports, jit)
    proc = _run([sys.executable, script], {"SMDEBUG_CONFIG_FILE_PATH": _config(tmp_path, out_dir)}, tmp_path)
    losses = json.loads(proc.stdout.strip().splitlines()[-1])
    trial = create_trial(out_dir)
    # 8 training steps (2 epochs of 4), 2 eval steps, 2 predict steps; every second one of each mode
    # saved, losses at every step
    assert trial.tensor("sequential/dense/kernel").steps(mode=modes.TRAIN) == [0, 2, 4, 6]
    assert trial.steps(mode=modes.EVAL) == [0, 1]
    assert trial.steps(mode=modes.PREDICT) == [0]
    names = set(trial.tensor_names())
    assert {
        "sequential/dense/kernel",
        "gradients/sequential/dense/kernelGrad",
        "dense/outputs",
        "loss",
    } <= names
    # the loss of every step (its own save interval); Keras' epoch loss is the one of its last step
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == list(range(8))
    assert trial.tensor("loss").value(3, mode=modes.TRAIN).item() == pytest.approx(losses[0], rel=1e-6)
    assert trial.tensor("loss").value(7, mode=modes.TRAIN).item() == pytest.approx(losses[1], rel=1e-6)
    assert os.path.exists(os.path.join(out_dir, "training_job_end.ts"))


def test_create_from_json_file_in_the_script_is_the_activated_hook(tmp_path):
    """The reference's script form under SMDEBUG_CONFIG_FILE_PATH: `smd.KerasHook.create_from_json_file()`
    gives the hook activated on import (a second hook of the file failed with OutDirExistsError)."""
    out_dir = str(tmp_path / "run")
    script = _script(tmp_path, "import keras\nimport smdebug.tensorflow as smd")
    source = Path(script).read_text()
    source = source.replace(
        "history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)",
        "hook = smd.KerasHook.create_from_json_file()\n"
        "assert hook is smd.get_hook() and isinstance(hook, smd.KerasHook), hook\n"
        "history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[hook])",
    )
    Path(script).write_text(source)
    _run([sys.executable, script], {"SMDEBUG_CONFIG_FILE_PATH": _config(tmp_path, out_dir)}, tmp_path)
    trial = create_trial(out_dir)
    assert trial.tensor("sequential/dense/kernel").steps(mode=modes.TRAIN) == [0, 2, 4, 6]
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == list(range(8))


def test_smdebug_run(tmp_path):
    out_dir = str(tmp_path / "run")
    script = _script(tmp_path)
    _run(
        [SMDEBUG_CLI, "run", "--out-dir", out_dir, "--collections", "gradients", "--save-interval", "4", "--"]
        + ["python", script],
        {},
        tmp_path,
    )
    trial = create_trial(out_dir)
    grads = trial.tensor_names(collection="gradients")
    assert len(grads) == 4
    value = trial.tensor(grads[0]).value(0)
    assert np.isfinite(value).all()


def test_no_config_no_hook(tmp_path):
    script = _script(tmp_path)
    _run([sys.executable, script], {}, tmp_path)
    assert not any(p.name.startswith("run") for p in tmp_path.iterdir())


# the reference's script mode on SageMaker (where a hook configuration is always present): the script makes
# its own hook, from that configuration or with its own arguments, and passes it to fit
OWN_HOOK = textwrap.dedent(
    """
    import sys
    import keras
    import numpy as np
    import smdebug.tensorflow as smd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = rng.integers(0, 3, size=(32,))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if sys.argv[1] == "json":
        hook = smd.KerasHook.create_from_json_file()
    else:
        hook = smd.KerasHook(out_dir=sys.argv[1], include_collections=["gradients"],
                             save_config=smd.SaveConfig(save_interval=1))
    assert smd.get_hook() is hook
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[hook])
    hook.close()
    """
)


@pytest.mark.parametrize("own", ["json", "arguments"])
def test_the_scripts_own_hook_under_a_hook_configuration(tmp_path, own):
    config_dir = str(tmp_path / "run")
    own_dir = str(tmp_path / "own")
    script = tmp_path / "train.py"
    script.write_text(OWN_HOOK)
    config = _config(tmp_path, config_dir, collections=("weights",))
    _run(
        [sys.executable, str(script), "json" if own == "json" else own_dir],
        {"SMDEBUG_CONFIG_FILE_PATH": config},
        tmp_path,
    )
    if own == "json":  # the hook built from the configuration, once
        trial = create_trial(config_dir)
        assert trial.steps(mode=modes.TRAIN) == [0, 1, 2, 3]  # losses at every step
        assert trial.tensor("sequential/dense/kernel").steps() == [0, 2]
    else:  # the script's hook alone: every step of it (a second hook in fit took some of them)
        trial = create_trial(own_dir)
        for name in ("gradients/sequential/dense/kernelGrad", "loss"):
            assert trial.tensor(name).steps(mode=modes.TRAIN) == [0, 1, 2, 3]
        assert not os.path.exists(config_dir) or not os.listdir(config_dir)
