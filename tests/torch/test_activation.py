"""Activation on `import torch`: an unmodified script (no smdebug import) produces a readable run, under
`smdebug run` and under SMDEBUG_CONFIG_FILE_PATH, in real subprocesses that start through the core's
startup file; plus the automatic registration of models and losses, in-process.
"""

import dataclasses
import json
import logging
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from smdebug import activation, plugins
from smdebug.trials import create_trial

SMDEBUG_CLI = str(Path(sys.executable).with_name("smdebug"))

# A training script that knows nothing of smdebug; it prints the loss of each step as JSON.
TRAIN = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8)
            self.fc2 = nn.Linear(8, 3)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    model = Net()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    losses = []
    for step in range(4):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    EXTRA
    print(json.dumps(losses))
    """
)


def _script(tmp_path, extra=""):
    path = tmp_path / "train.py"
    path.write_text(TRAIN.replace("EXTRA", extra))
    return path


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("SMDEBUG_DISABLE", "USE_SMDEBUG")}
    env.pop("SMDEBUG_CONFIG_FILE_PATH", None)
    env.update(extra)
    return env


def _losses(stdout):
    return json.loads(stdout.strip().splitlines()[-1 if stdout.strip().startswith("[") else 0])


def test_startup_file_is_installed():
    found = [Path(d) / "zz-smdebug-activation.pth" for d in site.getsitepackages()]
    assert any(p.is_file() for p in found), (
        "zz-smdebug-activation.pth is missing from site-packages: this venv has an install of smdebug-core "
        "older than activation; reinstall the core (nox -s tests-torch does)"
    )


def test_smdebug_run_unmodified_script(tmp_path):
    out = tmp_path / "run"
    script = _script(tmp_path)
    done = subprocess.run(
        [SMDEBUG_CLI, "run", "--out-dir", str(out), "--collections", "weights", "gradients", "losses",
         "--save-interval", "1", "--", "python", str(script)],
        capture_output=True, text=True, env=_env(), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"smdebug run: run saved to {out}" in done.stdout
    losses = json.loads(done.stdout.splitlines()[0])

    trial = create_trial(str(out))
    assert trial.steps() == [0, 1, 2, 3]
    assert {"Net_fc1.weight", "Net_fc2.weight"} <= set(trial.tensor_names(collection="weights"))
    assert {"gradient/Net_fc1.weight", "gradient/Net_fc2.bias"} <= set(
        trial.tensor_names(collection="gradients")
    )
    saved = [trial.tensor("CrossEntropyLoss_output_0").value(s).item() for s in range(4)]
    np.testing.assert_allclose(saved, losses, rtol=1e-6)
    assert trial.tensor("Net_fc1.weight").value(0).shape == (8, 4)


def test_activation_on_import_does_not_import_dynamo(tmp_path):
    # torch._dynamo costs about a second of start-up: the hook waits until the script imports it
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"LocalPath": str(tmp_path / "run")}))
    code = "import sys, torch, smdebug.hook; print(smdebug.hook.get_hook(), 'torch._dynamo' in sys.modules)"
    env = _env(SMDEBUG_CONFIG_FILE_PATH=str(config))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<Hook ") and done.stdout.strip().endswith("False"), done.stdout


def test_config_file_env_unmodified_script(tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "hook.json"
    config.write_text(
        json.dumps(
            {
                "LocalPath": str(out),
                "HookParameters": {"save_interval": "2"},
                "CollectionConfigurations": [{"CollectionName": "weights"}, {"CollectionName": "losses"}],
            }
        )
    )
    script = _script(tmp_path)
    env = _env(SMDEBUG_CONFIG_FILE_PATH=str(config))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    losses = _losses(done.stdout)

    trial = create_trial(str(out))
    assert trial.steps() == [0, 2]
    assert trial.tensor_names(collection="gradients") == []
    np.testing.assert_allclose(
        trial.tensor("CrossEntropyLoss_output_0").value(2).item(), losses[2], rtol=1e-6
    )
    assert "Net_fc2.bias" not in trial.tensor_names()  # biases were not asked for


def test_create_from_json_file_in_the_script_is_the_activated_hook(tmp_path):
    """The reference's script form under SMDEBUG_CONFIG_FILE_PATH: `smd.Hook.create_from_json_file()`
    (with no path, or this file's) gives the hook activated on `import torch`; a second hook of the
    file failed with OutDirExistsError, the run being the first hook's."""
    out = tmp_path / "run"
    config = tmp_path / "hook.json"
    config.write_text(
        json.dumps(
            {
                "LocalPath": str(out),
                "HookParameters": {"save_interval": "2"},
                "CollectionConfigurations": [{"CollectionName": "weights"}, {"CollectionName": "losses"}],
            }
        )
    )
    script = _script(tmp_path)
    source = (
        script.read_text()
        .replace(
            "model = Net()\n",
            "model = Net()\n"
            "import smdebug.pytorch as smd\n"
            "hook = smd.Hook.create_from_json_file()\n"
            f"assert smd.Hook.create_from_json_file({str(config)!r}) is hook is smd.get_hook()\n"
            "hook.register_module(model)\n",
        )
        .replace(
            "loss_fn = nn.CrossEntropyLoss()\n",
            "loss_fn = nn.CrossEntropyLoss()\nhook.register_loss(loss_fn)\n",
        )
    )
    script.write_text(source)
    env = _env(SMDEBUG_CONFIG_FILE_PATH=str(config))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    losses = _losses(done.stdout)
    trial = create_trial(str(out))
    assert trial.steps() == [0, 2]
    assert set(trial.tensor_names(collection="weights")) == {"Net_fc1.weight", "Net_fc2.weight"}
    np.testing.assert_allclose(
        trial.tensor("CrossEntropyLoss_output_0").value(2).item(), losses[2], rtol=1e-6
    )


def test_get_hook_returns_the_active_hook(tmp_path):
    out = tmp_path / "run"
    extra = textwrap.dedent(
        """
        import smdebug.pytorch as smd
        hook = smd.get_hook()
        print(type(hook).__name__, hook.out_dir, file=sys.stderr)
        hook.save_scalar("final_loss", losses[-1])
        """
    )
    script = _script(tmp_path, extra)
    done = subprocess.run(
        [SMDEBUG_CLI, "run", "--out-dir", str(out), "--", "python", str(script)],
        capture_output=True, text=True, env=_env(), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"Hook {out}" in done.stderr
    losses = json.loads(done.stdout.splitlines()[0])
    trial = create_trial(str(out))
    assert trial.tensor("scalar/final_loss").value(trial.tensor("scalar/final_loss").steps()[0]).item() == (
        pytest.approx(losses[-1], rel=1e-6)
    )


def test_spawned_workers_and_subprocesses_do_not_fail(tmp_path):
    """Processes the activated script starts inherit its configuration: a spawned DataLoader worker and a
    subprocess that import torch must run (they exited with 2, "out_dir already holds a run", and the
    DataLoader raised) while the script's own process writes the run."""
    out = tmp_path / "run"
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import subprocess, sys, torch
            from torch.utils.data import DataLoader, TensorDataset

            if __name__ == "__main__":
                torch.set_num_threads(1)
                data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
                model, loss_fn = torch.nn.Linear(4, 1), torch.nn.MSELoss()
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for x, y in DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context="spawn"):
                    opt.zero_grad()
                    loss_fn(model(x), y).backward()
                    opt.step()
                child = subprocess.run([sys.executable, "-c", "import torch"])
                print("child", child.returncode)
            """
        )
    )
    done = subprocess.run(
        [SMDEBUG_CLI, "run", "--out-dir", str(out), "--collections", "losses", "--save-interval", "1",
         "--", "python", str(script)],
        capture_output=True, text=True, env=_env(), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "child 0" in done.stdout, done.stderr
    assert "bad hook configuration" not in done.stderr
    assert create_trial(str(out)).steps() == [0, 1]


def test_smdebug_run_torchrun_saves_the_ranks_run(tmp_path):
    """torchrun imports torch too: its hook claimed worker_0 first, so rank 0 saved nothing (and the
    launcher's exit removed the run). The launcher is skipped; the rank writes the run."""
    out = tmp_path / "run"
    script = _script(tmp_path)
    done = subprocess.run(
        [SMDEBUG_CLI, "run", "--out-dir", str(out), "--collections", "weights", "losses", "--save-interval", "1",
         "--", "python", "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", "29531",
         str(script)],
        capture_output=True, text=True, env=_env(), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "another writer of worker_0" not in done.stderr, done.stderr
    trial = create_trial(str(out))
    assert trial.steps() == [0, 1, 2, 3] and trial.workers() == ["worker_0"]
    assert "Net_fc1.weight" in trial.tensor_names(collection="weights")


@pytest.mark.parametrize("switch", [{"SMDEBUG_DISABLE": "1"}, {"USE_SMDEBUG": "0"}])
def test_disable_switches(tmp_path, switch):
    out = tmp_path / "run"
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"LocalPath": str(out), "HookParameters": {"save_interval": "1"}}))
    env = _env(SMDEBUG_CONFIG_FILE_PATH=str(config), **switch)
    code = (
        "import torch, sys, smdebug.pytorch as smd; a = sys.modules.get('smdebug.activation'); "
        "print(smd.get_hook(), bool(a and a.activated()))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "False"]
    assert not out.exists()


def test_bad_configuration_stops_the_script_with_one_line(tmp_path):
    """smdebug was asked for and its configuration is wrong: no training without it (exit code 2, as
    `smdebug run --config` with the same file), one line naming the problem and the fix."""
    config = tmp_path / "hook.json"
    config.write_text(
        json.dumps({"LocalPath": str(tmp_path / "run"), "HookParameters": {"save_intervall": "1"}})
    )
    script = _script(tmp_path)
    env = _env(SMDEBUG_CONFIG_FILE_PATH=str(config))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == "" and "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "smdebug" in line]
    assert len(lines) == 1, done.stderr
    assert "bad hook configuration" in lines[0] and "SMDEBUG_CONFIG_FILE_PATH" in lines[0]
    assert "HookParameters.save_intervall: unknown key" in lines[0]
    assert not (tmp_path / "run").exists()


def test_script_with_its_own_hook_takes_over(tmp_path):
    auto_out, own_out = tmp_path / "auto", tmp_path / "own"
    script = _script(tmp_path)
    source = script.read_text().replace(
        "model = Net()\n",
        "model = Net()\n"
        "import smdebug.pytorch as smd\n"
        f"hook = smd.Hook(out_dir={str(own_out)!r}, save_config=smd.SaveConfig(save_interval=1), "
        "include_collections=['weights'])\n"
        "hook.register_module(model)\n",
    )
    script.write_text(source)
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"LocalPath": str(auto_out), "HookParameters": {"save_interval": "1"}}))
    env = _env(SMDEBUG_CONFIG_FILE_PATH=str(config))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert create_trial(str(own_out)).steps() == [0, 1, 2, 3]
    assert not auto_out.exists()


@pytest.mark.parametrize("how", ["own hook", "smdebug run"])
def test_a_scripts_own_hook_may_take_the_configurations_out_dir(tmp_path, how):
    """SageMaker's BYOC form: the script's hook saves to LocalPath (or builds itself from the same file
    under `smdebug run`, which hands the command a copy of it). The hook activated on import has written
    nothing there: its claim on the folder goes, the script's hook writes the run."""
    out = tmp_path / "run"
    config = tmp_path / "hook.json"
    settings = {
        "HookParameters": {"save_interval": "1"},
        "CollectionConfigurations": [{"CollectionName": "weights"}],
    }
    config.write_text(json.dumps({"LocalPath": str(out), **settings}))
    own = (
        f"smd.Hook(out_dir={str(out)!r}, save_config=smd.SaveConfig(save_interval=1), include_collections=['weights'])"
        if how == "own hook"
        else f"smd.Hook.create_from_json_file({str(config)!r})"
    )
    script = _script(tmp_path)
    script.write_text(
        script.read_text().replace(
            "model = Net()\n",
            f"model = Net()\nimport smdebug.pytorch as smd\nhook = {own}\nhook.register_module(model)\n",
        )
    )
    if how == "own hook":
        command, env = [sys.executable, str(script)], _env(SMDEBUG_CONFIG_FILE_PATH=str(config))
    else:
        command, env = (
            [SMDEBUG_CLI, "run", "--config", str(config), "--", sys.executable, str(script)],
            _env(),
        )
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    trial = create_trial(str(out))
    assert trial.steps() == [0, 1, 2, 3] and trial.workers() == ["worker_0"]
    assert "Net_fc1.weight" in trial.tensor_names()


# -- in-process ----------------------------------------------------------------------------------------
def test_unsupported_torch_version_skips_with_one_line(caplog):
    fw = plugins.frameworks()["pytorch"]
    assert fw.import_names == ("torch",) and fw.version_problem() is None
    activation.uninstall()
    try:
        with caplog.at_level(logging.INFO, logger="smdebug"):
            assert activation.activate(dataclasses.replace(fw, supported="<2"), torch) is None
        lines = [r.getMessage() for r in caplog.records if r.name == "smdebug"]
        assert lines == [
            f"smdebug: not activating pytorch on import of torch: torch {torch.__version__} is outside the "
            "supported range <2"
        ]
    finally:
        activation.uninstall()


class CustomLoss(nn.Module):
    def forward(self, out, target):
        return ((out - target) ** 2).mean()


def test_models_and_losses_are_registered_automatically(tmp_path):
    from smdebug_torch.activation import AutoRegistration
    from smdebug_torch.hook import Hook

    hook = Hook(
        out_dir=str(tmp_path / "run"),
        save_config=__import__("smdebug").SaveConfig(save_interval=1),
        include_collections=["weights", "losses"],
    )
    auto = AutoRegistration(hook)
    auto.install()
    try:
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        flatten, mse, custom = nn.Flatten(), nn.MSELoss(), CustomLoss()
        x, y = torch.randn(5, 3), torch.randn(5, 1)
        for _ in range(3):
            out = model(flatten(x))
            (mse(out, y) + custom(out, y)).backward()
    finally:
        auto.remove()
        hook.close()
    assert set(hook._models) == {model}
    assert set(hook._loss_modules) == {mse, custom}
    assert flatten not in hook._module_names  # neither a model nor a loss
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2]
    assert {"MSELoss_output_0", "CustomLoss_output_0"} <= set(trial.tensor_names(collection="losses"))
    assert "Sequential_0.weight" in trial.tensor_names(collection="weights")
    assert trial.tensor("CustomLoss_output_0").steps() == [0, 1, 2]
    # torch's global hooks are gone once removed
    assert not torch.nn.modules.module._global_forward_pre_hooks
