"""The main job: train a small PyTorch model with the smdebug hook, then analyse the saved run.

    nox -s demo            (or: python examples/demo.py --out-dir /tmp/smdebug-demo)

The data is generated here. The model is a small MLP; one of its layers starts with weights far too
small (the planted problem), so its gradients are tiny while the rest of the network trains. The
analysis reads the run back with the Trial API and runs a rule over it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

import smdebug.pytorch as smd
from smdebug.exceptions import RuleEvaluationConditionMet
from smdebug.rules.rule import Rule
from smdebug.rules.rule_invoker import invoke_rule


def make_data(n=2048, features=20, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 2.0, size=(classes, features))
    labels = rng.integers(0, classes, size=n)
    x = centers[labels] + rng.normal(0, 1.0, size=(n, features))
    return torch.tensor(x, dtype=torch.float32), torch.tensor(labels, dtype=torch.long)


class Net(nn.Module):
    def __init__(self, features=20, classes=4):
        super().__init__()
        self.fc1 = nn.Linear(features, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, classes)
        with torch.no_grad():  # the planted problem: a layer initialised a million times too small
            self.fc2.weight.mul_(1e-6)
            self.fc2.bias.zero_()

    def forward(self, x):
        return self.fc3(torch.sigmoid(self.fc2(torch.sigmoid(self.fc1(x)))))


class TinyGradientRule(Rule):
    """Fires when the mean absolute gradient of some layer falls below a threshold."""

    def __init__(self, base_trial, threshold="1e-4"):
        super().__init__(base_trial)
        self.threshold = self.parse_float("threshold", threshold)
        self.culprits: dict[int, list[str]] = {}

    def invoke_at_step(self, step):
        small = [
            name
            for name in self.base_trial.tensor_names(collection="gradients", step=step)
            if self.base_trial.tensor(name).reduction_value(step, "mean", abs=True) < self.threshold
        ]
        if small:
            self.culprits[step] = small
        return bool(small)


def train(out_dir: str, steps: int = 200) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    model, loss_fn = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    hook = smd.Hook(
        out_dir=out_dir,
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
        for start in range(0, 512, 128):
            loss_fn(model(x[start : start + 128]), y[start : start + 128])
    hook.close()


def analyse(out_dir: str) -> int:
    trial = smd.create_trial(out_dir=out_dir)
    print(f"\nRun saved in {out_dir}")
    print(f"  steps (TRAIN): {trial.steps(mode=smd.modes.TRAIN)}")
    print(f"  steps (EVAL):  {trial.steps(mode=smd.modes.EVAL)}")
    print(f"  collections:   {sorted(trial.collections())}")
    print(f"  tensors:       {len(trial.tensor_names())}")
    (loss_name,) = trial.tensor_names(collection="losses")
    loss = trial.tensor(loss_name)
    print(f"\n{loss_name} (TRAIN):")
    for step in loss.steps(mode=smd.modes.TRAIN):
        print(f"  step {step:4d}  {float(loss.value(step, mode=smd.modes.TRAIN)):.4f}")
    print("\nmean |gradient| at the last saved step:")
    last = trial.steps(mode=smd.modes.TRAIN)[-1]
    for name in trial.tensor_names(collection="gradients"):
        value = trial.tensor(name).reduction_value(last, "mean", abs=True, mode=smd.modes.TRAIN)
        print(f"  {name:32s} {value:.3e}")
    rule = TinyGradientRule(trial, threshold="1e-4")
    try:
        invoke_rule(rule, raise_eval_cond=True)
        print("\nRule TinyGradientRule: no issue found")
        return 0
    except RuleEvaluationConditionMet as fired:
        print(f"\nRule TinyGradientRule fired at step {fired.step}: {', '.join(rule.culprits[fired.step])}")
        return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="where to save the run (default: a new temporary folder)")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    out_dir = args.out_dir or str(Path(tempfile.mkdtemp(prefix="smdebug-demo-")) / "run")
    if args.out_dir and Path(out_dir).exists():
        shutil.rmtree(out_dir)
    train(out_dir, args.steps)
    return analyse(out_dir)


if __name__ == "__main__":
    sys.exit(main())
