"""Training runs and a reader written only against the smdebug 1.0 API (``smd`` is ``smdebug.pytorch``).

The same code runs in this repo's venv with our plugin and in the smdebug 1.0.34 venv with the real
library (through ``smdebug_driver.py``), so runs and what each library reads of them can be compared.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------------------------------------------
# Models


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x.flatten(1))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x.view(-1, 1, 2, 3)))))
        return self.fc(x.flatten(1))


class GRUNet(nn.Module):
    """A recurrent layer returning a tuple, and one module called twice per forward."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(3, 4, batch_first=True)
        self.act = nn.Tanh()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        out, _ = self.rnn(self.act(x.view(-1, 2, 3)))
        return self.fc(self.act(out[:, -1]))


def batch(step: int, size: int = 5):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)


def _setup(smd, out_dir, model_cls, **hook_args):
    torch.manual_seed(0)
    hook = smd.Hook(out_dir=out_dir, **hook_args)
    model = model_cls()
    criterion = nn.CrossEntropyLoss()
    return hook, model, criterion


def _train(hook, model, criterion, steps, start=0, extra=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for step in range(start, start + steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = criterion(model(x), y)
        if extra is not None:
            extra(step, loss)
        loss.backward()
        opt.step()


def _evaluate(model, criterion, steps, start=100, extra=None):
    model.eval()
    with torch.no_grad():
        for step in range(start, start + steps):
            x, y = batch(step)
            loss = criterion(model(x), y)
            if extra is not None:
                extra(step, loss)


# ---------------------------------------------------------------------------------------------------
# Scenarios: each writes one run to out_dir and closes its hook.


def scenario_default_config(smd, out_dir):
    """No configuration at all: smdebug's defaults (losses, every 500 steps)."""
    hook, model, criterion = _setup(smd, out_dir, MLP)
    hook.register_module(model)
    hook.register_loss(criterion)
    _train(hook, model, criterion, steps=3)
    hook.close()


def scenario_save_all(smd, out_dir):
    """Everything, at some steps, in TRAIN then EVAL."""
    hook, model, criterion = _setup(
        smd, out_dir, CNN, save_all=True, save_config=smd.SaveConfig(save_steps=[0, 2])
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    hook.set_mode(smd.modes.TRAIN)
    _train(hook, model, criterion, steps=3)
    hook.set_mode(smd.modes.EVAL)
    _evaluate(model, criterion, steps=3)
    hook.close()


def scenario_reductions(smd, out_dir):
    """Every reduction and norm, plain and absolute, instead of the raw tensors."""
    config = smd.ReductionConfig(
        reductions=["min", "max", "mean", "std", "variance", "sum", "prod"],  # 1.0.34 has no median
        abs_reductions=["min", "max", "mean", "sum"],
        norms=["l1", "l2"],
        abs_norms=["l1", "l2"],
    )
    hook, model, criterion = _setup(
        smd,
        out_dir,
        MLP,
        include_collections=["weights", "biases", "gradients", "losses"],
        save_config=smd.SaveConfig(save_interval=2),
        reduction_config=config,
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    _train(hook, model, criterion, steps=4)
    hook.close()


def scenario_mode_configs(smd, out_dir):
    """Per-mode save configurations; TRAIN, EVAL, TRAIN again (mode steps go on), then PREDICT."""
    save_config = smd.SaveConfig(
        mode_save_configs={
            smd.modes.TRAIN: smd.SaveConfigMode(save_interval=2),
            smd.modes.EVAL: smd.SaveConfigMode(save_steps=[1, 2]),
            smd.modes.PREDICT: smd.SaveConfigMode(save_steps=[0]),
        }
    )
    hook, model, criterion = _setup(
        smd,
        out_dir,
        CNN,
        include_collections=["weights", "biases", "gradients", "losses"],
        save_config=save_config,
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    hook.set_mode(smd.modes.TRAIN)
    _train(hook, model, criterion, steps=3)
    hook.set_mode(smd.modes.EVAL)
    _evaluate(model, criterion, steps=3)
    hook.set_mode(smd.modes.TRAIN)
    _train(hook, model, criterion, steps=2, start=3)
    hook.set_mode(smd.modes.PREDICT)
    _evaluate(model, criterion, steps=2, start=200)
    hook.close()


def scenario_custom_collections(smd, out_dir):
    """include_regex, a regex collection with its own save and reduction configs, module tensors."""
    hook, model, criterion = _setup(
        smd,
        out_dir,
        GRUNet,
        include_regex=["fc_output"],
        include_collections=["rnn_weights", "rnn_norms", "act_io", "losses"],
        save_config=smd.SaveConfig(save_interval=1),
    )
    hook.get_collection("rnn_weights").include("^GRUNet_rnn\\.weight")
    norms = hook.get_collection("rnn_norms")
    norms.include("rnn\\.bias")
    norms.save_config = smd.SaveConfig(save_steps=[1, 2])
    norms.reduction_config = smd.ReductionConfig(norms=["l2"], abs_reductions=["max"], save_shape=True)
    hook.get_collection("act_io").add_module_tensors(model.act, inputs=True, outputs=True)
    hook.register_module(model)
    hook.register_loss(criterion)
    _train(hook, model, criterion, steps=3)
    hook.close()


def scenario_scalars_and_tensors(smd, out_dir):
    """save_scalar and save_tensor during training steps, save_scalar during evaluation.

    smdebug 1.0.34 writes a saved tensor at the next module or gradient callback, and cached scalars when
    the next step starts (in the mode current then): calls are placed where both libraries agree.
    """
    hook, model, criterion = _setup(
        smd, out_dir, MLP, include_collections=["losses"], save_config=smd.SaveConfig(save_interval=1)
    )
    # smdebug 1.0.34 fails on a collection first named in a step, and on one named without tensors
    hook.get_collection("custom_stats").add_tensor_name("batch_stats")
    hook.register_module(model)
    hook.register_loss(criterion)

    def train_extra(step, loss):  # before backward: smdebug writes the tensors in its gradient callbacks
        if step < 3:  # not the last TRAIN step: smdebug would write its scalars in EVAL mode
            hook.save_scalar("step_x2", float(step * 2))
            hook.save_scalar("loss_copy", loss.detach())
        hook.save_tensor("batch_stats", torch.stack([loss.detach(), loss.detach() * 2]), "custom_stats")
        hook.save_tensor("label_counts", torch.bincount(batch(step)[1], minlength=3))

    def eval_extra(step, loss):
        hook.save_scalar("eval_loss", loss)

    hook.set_mode(smd.modes.TRAIN)
    _train(hook, model, criterion, steps=4, extra=train_extra)
    hook.set_mode(smd.modes.EVAL)
    _evaluate(model, criterion, steps=2, extra=eval_extra)
    hook.close()


def scenario_scalars_outside_steps(smd, out_dir):
    """save_scalar before the first step (it goes into step 0, whose number stays) and between the last
    TRAIN step and the first EVAL step (into the TRAIN step; EVAL's mode steps still start at 0)."""
    hook, model, criterion = _setup(
        smd, out_dir, MLP, include_collections=["losses"], save_config=smd.SaveConfig(save_interval=1)
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    hook.set_mode(smd.modes.TRAIN)
    hook.save_scalar("learning_rate", 0.1)
    _train(hook, model, criterion, steps=3)
    hook.set_mode(smd.modes.EVAL)
    hook.save_scalar("epoch_accuracy", 0.5)
    _evaluate(model, criterion, steps=2)
    hook.close()


def _distributed_rank(smd, out_dir):
    """One rank of scenario_distributed (RANK, WORLD_SIZE, MASTER_* in the environment, as torchrun sets)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        hook, model, criterion = _setup(
            smd,
            out_dir,
            MLP,
            include_collections=["weights", "gradients", "losses", "relu_out"],
            include_workers="all",
            save_config=smd.SaveConfig(save_interval=2),
        )
        hook.get_collection("relu_out").add_module_tensors(model.relu, outputs=True)
        ddp = nn.parallel.DistributedDataParallel(model)
        hook.register_module(ddp)
        hook.register_loss(criterion)
        _train(hook, ddp, criterion, steps=3, start=10 * rank)  # each rank its own data
        hook.close()
        dist.barrier()  # no rank tears the group down while the other still uses it
    finally:
        dist.destroy_process_group()


def scenario_distributed(smd, out_dir):
    """Two real gloo ranks, a DistributedDataParallel model, every worker saving (include_workers="all")."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    ranks = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "distributed-rank", out_dir],
            env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in ranks]
    for rank, (p, out) in enumerate(zip(ranks, outputs)):
        if p.returncode:
            raise RuntimeError(f"rank {rank} of scenario_distributed failed:\n{out[-3000:]}")


SCENARIOS = {
    name[len("scenario_") :]: fn for name, fn in sorted(globals().items()) if name.startswith("scenario_")
}


def write_runs(smd, root, names=None):
    """Write every scenario (or those named) to root/<scenario>."""
    torch.set_num_threads(1)
    for name in names or SCENARIOS:
        SCENARIOS[name](smd, os.path.join(root, name))


# ---------------------------------------------------------------------------------------------------
# Reading: what a library sees of a run, as JSON (values as exact bytes).


def _array(value) -> dict:
    a = np.asarray(value)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "hex": np.ascontiguousarray(a).tobytes().hex()}


def describe(create_trial, modes, path) -> dict:
    """Everything the smdebug 1.0 Trial API tells about the run at path."""
    trial = create_trial(path)
    all_modes = [modes.GLOBAL, modes.TRAIN, modes.EVAL, modes.PREDICT]
    out = {
        "workers": list(trial.workers()),
        "steps": {m.name: list(trial.steps(mode=m)) for m in all_modes},
        "step_modes": {str(s): [trial.mode(s).name, trial.mode_step(s)] for s in trial.steps()},
        "tensor_names": list(trial.tensor_names()),
        "tensor_names_by_step": {
            f"{m.name}/{s}": list(trial.tensor_names(step=s, mode=m))
            for m in all_modes
            for s in trial.steps(mode=m)
        },
        "collections": {},
        "tensors": {},
    }
    for name, coll in sorted(trial.collections().items()):
        out["collections"][name] = {
            "tensor_names": sorted(coll.tensor_names),
            "include_regex": sorted(coll.include_regex),
            "saved": list(trial.tensor_names(collection=name)),
        }
    for name in trial.tensor_names():
        t = trial.tensor(name)
        info = {"steps": {m.name: list(t.steps(mode=m)) for m in all_modes}, "workers": {}, "values": {}}
        for step in t.steps():
            for worker in sorted(t.workers(step)):
                key = f"{step}/{worker}"
                info["workers"][str(step)] = sorted(t.workers(step))
                try:
                    value = _array(t.value(step, worker=worker))
                except Exception as exc:  # only reductions were saved
                    value = type(exc).__name__
                reductions = {
                    ("abs_" if absolute else "") + red: _array(v)
                    for (red, absolute), v in t.reduction_values(step, worker=worker).items()
                }
                try:
                    shape = list(t.shape(step, worker=worker))
                except Exception as exc:  # neither the value nor its shape was saved
                    shape = type(exc).__name__
                info["values"][key] = {"value": value, "shape": shape, "reductions": reductions}
        out["tensors"][name] = info
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["distributed-rank"]:
    import smdebug.pytorch  # whichever smdebug this interpreter has: ours or 1.0.34

    _distributed_rank(smdebug.pytorch, sys.argv[2])
