"""A small real run, trained in numpy with the core's hook (tests/numpy_training.py) and saved once per
session, for the analysis tools to read."""

import numpy as np
import pytest
from numpy_training import SGD, CrossEntropyLoss, Linear, NumpyHook, ReLU, train_step
from numpy_training import Net as _Net
from support import png_size, smdebug_cli

import smdebug
from smdebug import plugins

TRAIN_STEPS = 6
EVAL_STEPS = 2
SAVE_INTERVAL = 2


def Net(seed=0):
    """fc1 -> relu -> fc2, 4 inputs, 3 classes."""
    rng = np.random.default_rng(seed)
    return _Net("Net", [("fc1", Linear(4, 8, rng)), ("relu", ReLU()), ("fc2", Linear(8, 3, rng))])


def batch(rng, n=16):
    return rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, 3, n)


def train(out_dir, train_steps=TRAIN_STEPS, eval_steps=EVAL_STEPS, configure=None, **hook_kwargs):
    """Train Net with the hook; weights without histograms, biases saved as reductions only."""
    rng = np.random.default_rng(0)
    model, loss_fn, optimizer = Net(), CrossEntropyLoss(), SGD(lr=0.1)
    kwargs = {
        "save_config": smdebug.SaveConfig(save_interval=SAVE_INTERVAL),
        "include_collections": ["weights", "biases", "gradients", "losses"],
        **hook_kwargs,
    }
    hook = NumpyHook(out_dir=str(out_dir), **kwargs)
    hook.get_collection("weights").save_histogram = False
    hook.get_collection("biases").reduction_config = smdebug.ReductionConfig(
        norms=["l2"], abs_reductions=["max"]
    )
    if configure is not None:
        configure(hook)
    hook.set_mode(smdebug.modes.TRAIN)
    for step in range(train_steps):
        train_step(hook, model, *batch(rng), loss_fn, optimizer)
        hook.save_scalar("lr", 0.1 / (step + 1))
    hook.set_mode(smdebug.modes.EVAL)
    for _ in range(eval_steps):
        train_step(hook, model, *batch(rng), loss_fn)
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


@pytest.fixture
def png():
    return png_size
