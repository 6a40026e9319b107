"""Runs for the rules suite's tests of the rule machinery (the API, the CLI, actions), trained in numpy
with the core's hook (tests/numpy_training.py). The built-in rules on real PyTorch trainings with planted
defects: tests/torch/test_builtin_rules.py."""

from __future__ import annotations

import numpy as np
from numpy_training import SGD, Linear, MSELoss, Net, NumpyHook, ReLU, Sigmoid, regression_data, train_step

import smdebug

FEATURES = 8


def mlp(seed=0) -> Net:
    rng = np.random.default_rng(seed)
    return Net("MLP", [("fc1", Linear(FEATURES, 16, rng)), ("relu", ReLU()), ("fc2", Linear(16, 1, rng))])


def deep_sigmoid(depth=6, init_std=1e-3, seed=0) -> Net:
    rng = np.random.default_rng(seed)
    layers = []
    for i in range(depth):
        layers += [(f"layers.{2 * i}", Linear(FEATURES, FEATURES, rng, std=init_std))]
        layers += [(f"layers.{2 * i + 1}", Sigmoid())]
    return Net("DeepSigmoid", [*layers, ("out", Linear(FEATURES, 1, rng))])


def make_hook(out, include=("weights", "gradients", "losses")) -> NumpyHook:
    return NumpyHook(
        out_dir=out, save_config=smdebug.SaveConfig(save_interval=1), include_collections=include
    )


def train(hook, lr, steps=30, on_step=None, model=None) -> int:
    """Train an MLP (or ``model``) with the hook on fixed data; the number of optimizer steps done."""
    x, y = regression_data(features=FEATURES)
    model, loss_fn, opt = model or mlp(), MSELoss(), SGD(lr)
    done = 0
    for step in range(steps):
        if on_step:
            on_step(step)
        train_step(hook, model, x, y, loss_fn, opt)
        done += 1
    return done


def vanishing_gradient(out, bad) -> None:
    """bad: a deep sigmoid network initialised with tiny weights, whose gradients vanish; else an MLP."""
    hook = make_hook(out)
    train(hook, lr=0.05, steps=4, model=deep_sigmoid() if bad else mlp())
    hook.close()
