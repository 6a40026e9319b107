"""A new user's first hour with the PyTorch hook: the README's snippet, read in the training process."""

import re
import subprocess
import sys
from pathlib import Path

import torch
from support import assert_no_rule_fires
from torch import nn

import smdebug.pytorch as smd

README = Path(__file__).parents[2] / "README.md"


def _train(hook, steps):
    torch.manual_seed(0)
    model, loss_fn = nn.Linear(4, 2), nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss_fn(model(torch.randn(8, 4)), torch.randn(8, 2)).backward()
        optimizer.step()
    return model


def test_trial_in_the_training_process_sees_every_step_saved_so_far(tmp_path):
    out = str(tmp_path / "run")
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    _train(hook, 3)
    trial = smd.create_trial(out_dir=out)  # no hook.close(): the hook flushes for a reader of its run
    assert trial.steps() == [0, 1, 2]
    loss = trial.tensor(trial.tensor_names(collection="losses")[0])
    assert loss.steps() == [0, 1, 2]
    assert not hook.closed
    _train(hook, 2)  # training goes on after the read, in new steps
    hook.close()
    assert smd.create_trial(out).steps() == [0, 1, 2, 3, 4]


def test_the_readme_snippet_closes_the_hook_and_reads_every_step(tmp_path):
    snippet = re.search(r"## Using it\s+```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert "hook.close()" in snippet
    out = str(tmp_path / "run")
    training = (
        "for _ in range(21):\n"
        "    optimizer.zero_grad()\n"
        "    loss_fn(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()\n"
        "    optimizer.step()\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "model, loss_fn = torch.nn.Linear(4, 2), torch.nn.CrossEntropyLoss()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + snippet.replace("/tmp/run", out).replace("# ... train as usual ...\n", training)
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("[0, 10, 20]"), result.stdout
    assert "gradient/" in result.stdout


def test_no_builtin_rule_fires_on_a_healthy_run(tmp_path):
    out = str(tmp_path / "run")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    loss_fn = nn.CrossEntropyLoss()
    hook = smd.Hook(
        out_dir=out,
        save_config=smd.SaveConfig(save_interval=2),
        include_collections=["weights", "biases", "gradients", "losses", "relu_input"],
    )
    hook.get_collection("relu_input").include(".*relu_input")
    hook.register_module(model)
    hook.register_loss(loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    for step in range(40):
        batch = slice(step % 4 * 16, step % 4 * 16 + 16)
        optimizer.zero_grad()
        loss_fn(model(x[batch]), y[batch]).backward()
        optimizer.step()
    hook.close()
    assert_no_rule_fires(out)


def test_a_misspelt_collection_is_warned_about_with_the_builtin_it_may_mean(tmp_path, caplog):
    # 'inputs' and 'outputs' name nothing in PyTorch: neither is offered as the other's correction
    hook = smd.Hook(out_dir=str(tmp_path / "run"), include_collections=["weigths", "inputs", "outputs"])
    with caplog.at_level("WARNING", logger="smdebug"):
        _train(hook, 1)
    hook.close()
    said = {
        name: line
        for line in caplog.messages
        for name in ("weigths", "inputs", "outputs")
        if f"'{name}'" in line
    }
    assert "did you mean 'weights'?" in said["weigths"]
    assert "did you mean" not in said["inputs"] and "did you mean" not in said["outputs"]
