"""Training scenarios written only against the smdebug 1.0 PyTorch API, so the same code runs with the
real smdebug 1.0.34 and with this plugin. ``saved_names`` reads what a run wrote straight from its
index files, so the two libraries' runs can be compared name for name, step for step.

Regenerate the golden file in a venv with torch, numpy<2, protobuf<=3.20.3, boto3, requests, pandas,
psutil and the smdebug 1.0.34 sources (its wheel, or PYTHONPATH pointing at them):

    python tests/torch/scenarios.py tests/torch/data/smdebug_1_0_34_names.json
"""

from __future__ import annotations

import glob
import json
import os
import socket
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, channels=4):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x))) + x


class Net(nn.Module):
    """Nested modules, a module called twice per forward, and an LSTM returning a nested tuple."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.act = nn.ReLU()
        self.layers = nn.Sequential(Block(), Block())
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.rnn = nn.LSTM(4, 5, batch_first=True)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        x = self.act(self.conv1(x))
        x = self.act(self.layers(x))
        x = self.pool(x).flatten(2).transpose(1, 2)  # (batch, 4 positions, 4 channels)
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def batch(step, size=6):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(size, 1, 8, 8, generator=g), torch.randint(0, 3, (size,), generator=g)


def train(hook, model, criterion, steps, eval_steps=0, smd=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if smd is not None:
        hook.set_mode(smd.modes.TRAIN)
    model.train()
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
    if eval_steps:
        hook.set_mode(smd.modes.EVAL)
        model.eval()
        with torch.no_grad():
            for step in range(eval_steps):
                x, y = batch(100 + step)
                criterion(model(x), y)


def make(smd, out_dir, **hook_args):
    torch.manual_seed(0)
    hook = smd.Hook(out_dir=out_dir, **hook_args)
    model = Net()
    criterion = nn.CrossEntropyLoss()
    return hook, model, criterion


def scenario_save_all_train_eval(smd, out_dir):
    hook, model, criterion = make(
        smd, out_dir, save_all=True, save_config=smd.SaveConfig(save_steps=[0, 1, 3])
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    train(hook, model, criterion, steps=4, eval_steps=2, smd=smd)
    return hook


def scenario_builtin_collections(smd, out_dir):
    hook, model, criterion = make(
        smd,
        out_dir,
        include_collections=["weights", "biases", "gradients"],
        save_config=smd.SaveConfig(save_interval=2),
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    train(hook, model, criterion, steps=3)
    return hook


def scenario_module_tensors(smd, out_dir):
    hook, model, criterion = make(
        smd,
        out_dir,
        include_collections=["relu_activations", "rnn_io"],
        save_config=smd.SaveConfig(save_interval=1),
    )
    hook.get_collection("relu_activations").add_module_tensors(model.act, inputs=True)
    hook.register_module(model)
    hook.register_loss(criterion)
    hook.get_collection("rnn_io").add_module_tensors(model.rnn)
    train(hook, model, criterion, steps=2)
    return hook


def scenario_include_regex(smd, out_dir):
    hook, model, criterion = make(
        smd, out_dir, include_regex=["conv1", "head_output"], save_config=smd.SaveConfig(save_interval=1)
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    train(hook, model, criterion, steps=2)
    return hook


def scenario_reductions(smd, out_dir):
    hook, model, criterion = make(
        smd,
        out_dir,
        include_collections=["weights", "gradients"],
        save_config=smd.SaveConfig(save_interval=1),
        reduction_config=smd.ReductionConfig(
            reductions=["mean", "max"], abs_reductions=["min"], norms=["l2"], abs_norms=["l1"]
        ),
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    train(hook, model, criterion, steps=2)
    return hook


def scenario_frozen_layer(smd, out_dir):
    hook, model, criterion = make(
        smd,
        out_dir,
        include_collections=["weights", "gradients"],
        save_config=smd.SaveConfig(save_interval=1),
    )
    model.conv1.requires_grad_(False)
    hook.register_module(model)
    hook.register_loss(criterion)
    train(hook, model, criterion, steps=2)
    return hook


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scenario_ddp_wrapped(smd, out_dir):
    """The DistributedDataParallel wrapper itself registered (one process, gloo)."""
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        hook, model, criterion = make(smd, out_dir, save_all=True, save_config=smd.SaveConfig(save_steps=[1]))
        ddp = nn.parallel.DistributedDataParallel(model)
        hook.register_module(ddp)
        hook.register_loss(criterion)
        train(hook, ddp, criterion, steps=2)
        hook.close()
    finally:
        dist.destroy_process_group()
    return hook


SCENARIOS = {
    name[len("scenario_") :]: fn for name, fn in sorted(globals().items()) if name.startswith("scenario_")
}


def saved_names(out_dir):
    """{global step: {"mode", "mode_step", "names"}} read from the index files of every worker."""
    steps = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "index", "*", "*.json"))):
        step = int(os.path.basename(path).split("_")[0])
        with open(path) as f:
            index = json.load(f)
        entry = steps.setdefault(str(step), {"names": []})
        entry["mode"] = index["meta"]["mode"]
        entry["mode_step"] = index["meta"]["mode_step"]
        entry["names"] = sorted(set(entry["names"]) | {t["tensorname"] for t in index["tensor_payload"]})
    return steps


def run_scenario(smd, name, out_dir):
    hook = SCENARIOS[name](smd, out_dir)
    hook.close()
    return saved_names(out_dir)


if __name__ == "__main__":
    import smdebug.pytorch as smd_module

    torch.set_num_threads(1)
    result = {}
    for scenario in SCENARIOS:
        with tempfile.TemporaryDirectory() as tmp:
            result[scenario] = run_scenario(smd_module, scenario, os.path.join(tmp, "run"))
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
