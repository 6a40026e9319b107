"""The main job: train a small PyTorch model with the smdebug hook, then analyse the saved run.

    nox -s demo            (or: python examples/demo.py --out-dir /tmp/smdebug-demo [--healthy])

The data (four Gaussian blobs) is generated here. The model is an MLP with a planted problem: a deep
stack of sigmoid layers, through which gradients shrink by a constant factor per layer, so the first
layers get almost no gradient and the network stays at chance. ``--healthy`` trains the same network
with ReLU activations instead. Then the run is read back with the Trial API: the built-in rules judge
it (a results table), a plot shows the losses and gradient norms (PNG), the losses are shown as a
pandas DataFrame, and the hook's TensorBoard export is ready for ``tensorboard --logdir``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import smdebug.pytorch as smd
from smdebug.exceptions import NoMoreData, RuleEvaluationConditionMet
from smdebug.rules import create_rule, invoke_rule

HIDDEN_LAYERS = 6
# The built-in rules that apply to this run, with the parameters given (as strings, as configs do).
RULES = [
    ("vanishing_gradient", {}),
    ("loss_not_decreasing", {"num_steps": "100", "diff_percent": "10"}),
    ("exploding_tensor", {"collection_names": "gradients"}),
    ("weight_update_ratio", {}),
    ("all_zero", {"collection_names": "weights"}),
]


def make_data(n=2048, features=20, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 2.0, size=(classes, features))
    labels = rng.integers(0, classes, size=n)
    x = centers[labels] + rng.normal(0, 1.0, size=(n, features))
    return torch.tensor(x, dtype=torch.float32), torch.tensor(labels, dtype=torch.long)


class Net(nn.Module):
    def __init__(self, features=20, classes=4, width=32, healthy=False):
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(HIDDEN_LAYERS))
        self.out = nn.Linear(width, classes)
        # The planted problem: sigmoid's slope is at most 1/4, so each layer shrinks the gradient.
        self.act = torch.relu if healthy else torch.sigmoid

    def forward(self, x):
        x = self.act(self.inp(x))
        for layer in self.hidden:
            x = self.act(layer(x))
        return self.out(x)


def train(out_dir: str, steps: int, healthy: bool) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    model, loss_fn = Net(healthy=healthy), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    hook = smd.Hook(
        out_dir=out_dir,
        export_tensorboard=True,  # TensorBoard summaries in <out_dir>/tensorboard
        save_config=smd.SaveConfig(save_interval=10),
        include_collections=["weights", "biases", "gradients", "losses"],
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (64,))
        optimizer.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
    hook.set_mode(smd.modes.EVAL)
    with torch.no_grad():
        for start in range(0, 1024, 64):
            loss_fn(model(x[start : start + 64]), y[start : start + 64])
    hook.close()


def run_rules(trial) -> list[tuple[str, str, str]]:
    """Each rule over every saved step: (rule, parameters, result) rows."""
    rows = []
    for name, params in RULES:
        rule = create_rule(name, trial, **params)
        shown = ", ".join(f"{k}={v}" for k, v in params.items()) or "defaults"
        try:
            invoke_rule(rule, raise_eval_cond=True)
            result = "ok"
        except NoMoreData:  # the end of the run: the rule never fired
            result = "ok"
        except RuleEvaluationConditionMet as fired:
            result = f"FIRED at step {fired.step}"
            if name == "vanishing_gradient":
                result += ": " + ", ".join(_vanished(trial, fired.step, rule.threshold))
        rows.append((name, shown, result))
    return rows


def _vanished(trial, step: int, threshold: float) -> list[str]:
    return [
        name.removeprefix("gradient/")
        for name in trial.tensor_names(collection="gradients", step=step)
        if trial.tensor(name).reduction_value(step, "mean", abs=True) < threshold
    ]


def analyse(out_dir: str, plot_path: str, healthy: bool = False) -> None:
    from smdebug.plots import plot
    from smdebug.trials import to_dataframe

    trial = smd.create_trial(out_dir=out_dir)
    train_steps = trial.steps(mode=smd.modes.TRAIN)
    print(f"\nRun saved in {out_dir}")
    print(
        f"  steps: {len(train_steps)} TRAIN ({train_steps[0]}..{train_steps[-1]}), "
        f"{len(trial.steps(mode=smd.modes.EVAL))} EVAL;  tensors: {len(trial.tensor_names())};  "
        f"collections: {', '.join(sorted(trial.collections()))}"
    )

    (loss_name,) = trial.tensor_names(collection="losses")
    losses = to_dataframe(trial, loss_name)  # one row per saved step: step, mode, mode_step, value, ...
    summary = losses.groupby("mode")["value"].agg(["count", "first", "last", "min"])
    print(f"\n{loss_name} per mode (smdebug.trials.to_dataframe):")
    print(summary.to_string(float_format=lambda v: f"{v:.4f}"))

    print("\nBuilt-in rules (smdebug.rules.create_rule + invoke_rule):")
    rows = run_rules(trial)
    widths = [max(len(r[i]) for r in rows + [("RULE", "PARAMETERS", "RESULT")]) for i in range(3)]
    for row in [("RULE", "PARAMETERS", "RESULT"), *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())

    panels = plot(
        trial,
        [[loss_name], [r"^gradient/.*weight$"]],
        plot_path,
        log=[False, True],
        panel_titles=["loss", "gradient l2 norms (log scale)"],
        title="smdebug demo: " + ("healthy ReLU network" if healthy else "deep sigmoid network"),
    )
    print(f"\nPlot of the losses and gradient norms: {plot_path} ({sum(len(p) for p in panels)} curves)")
    tensorboard = _command("tensorboard")
    if tensorboard is None:
        print(
            f"TensorBoard: pip install 'smdebug-core[tensorboard]', then tensorboard --logdir {out_dir}/tensorboard"
        )
    else:
        print(f"TensorBoard: {tensorboard} --logdir {out_dir}/tensorboard")
    cli = _command("smdebug") or f"{_shown(sys.executable)} -m smdebug"
    print(f"More: {cli} ls {out_dir}   |   {cli} show {out_dir} {loss_name}   |   {cli} rules {out_dir}")


def _command(name: str) -> str | None:
    """How to run this environment's ``name`` script from here: its bare name when PATH finds this one
    (after ``nox -s demo`` it does not: the scripts are in the session's venv), else its path."""
    here = Path(sys.executable).parent / name
    if not here.is_file():
        return None
    found = shutil.which(name)
    if found and Path(found).resolve() == here.resolve():
        return name
    return _shown(str(here))


def _shown(path: str) -> str:
    """A path as short as it can be written from the current directory."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return relative if len(relative) < len(path) and not relative.startswith("../..") else path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="where to save the run (default: a new temporary folder)")
    parser.add_argument("--plot", help="PNG to write (default: demo.png beside the run)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--healthy", action="store_true", help="train without the planted problem")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or str(Path(tempfile.mkdtemp(prefix="smdebug-demo-")) / "run")
    if args.out_dir and Path(out_dir).exists():
        shutil.rmtree(out_dir)
    plot_path = args.plot or str(Path(out_dir).parent / ("demo-relu.png" if args.healthy else "demo.png"))
    started = time.monotonic()
    kind = "ReLU (healthy)" if args.healthy else "sigmoid (the planted problem: vanishing gradients)"
    print(f"Training an MLP with {HIDDEN_LAYERS} hidden {kind} layers for {args.steps} steps...")
    train(out_dir, args.steps, args.healthy)
    analyse(out_dir, plot_path, args.healthy)
    print(f"\nDone in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
