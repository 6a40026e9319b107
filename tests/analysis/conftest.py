"""A small real PyTorch run (saved once per session) for the analysis tools to read."""

from pathlib import Path

import pytest
import torch
from support import smdebug_cli
from torch import nn

from smdebug import plugins

TRAIN_STEPS = 6
EVAL_STEPS = 2
SAVE_INTERVAL = 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def train(out_dir, train_steps=TRAIN_STEPS, eval_steps=EVAL_STEPS, configure=None, **hook_kwargs):
    """Train Net with the hook; weights without histograms, biases saved as reductions only."""
    import smdebug.pytorch as smd

    torch.manual_seed(0)
    model, loss_fn = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {
        "save_config": smd.SaveConfig(save_interval=SAVE_INTERVAL),
        "include_collections": ["weights", "biases", "gradients", "losses"],
        **hook_kwargs,
    }
    hook = smd.Hook(out_dir=str(out_dir), **kwargs)
    hook.get_collection("weights").save_histogram = False
    hook.get_collection("biases").reduction_config = smd.ReductionConfig(norms=["l2"], abs_reductions=["max"])
    if configure is not None:
        configure(hook)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    for step in range(train_steps):
        x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        hook.save_scalar("lr", 0.1 / (step + 1))
    hook.set_mode(smd.modes.EVAL)
    with torch.no_grad():
        for _ in range(eval_steps):
            loss_fn(model(torch.randn(16, 4)), torch.randint(0, 3, (16,)))
    hook.close()
    return hook


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    """A finished run, with the hook's own TensorBoard export in <run>/tensorboard."""
    out = tmp_path_factory.mktemp("analysis") / "run"
    plugins.reset()
    train(out, export_tensorboard=True)
    plugins.reset()
    return str(out)


@pytest.fixture
def trial(run_dir):
    from smdebug.trials import create_trial

    return create_trial(run_dir)


@pytest.fixture
def cli():
    return smdebug_cli


def read_tensorboard(folder):
    """TensorBoard's own reader over one run folder: {"scalars": {tag: [(step, value)]}, "histograms": ...}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    return {
        "scalars": {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags["scalars"]},
        "histograms": {
            t: [(e.step, e.histogram_value) for e in acc.Histograms(t)] for t in tags["histograms"]
        },
    }


@pytest.fixture
def tb():
    return read_tensorboard


def png_size(path):
    """(width, height) of a PNG file; fails unless the file is a PNG."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.fixture
def png():
    return png_size
