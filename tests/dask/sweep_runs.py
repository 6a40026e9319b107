"""A small sweep of real runs, trained in numpy and saved with the core's hook (tests/numpy_training.py),
some with a defect planted.

Each run trains a tiny regression model on fixed data (full batch), so runs are fast and the same on every
machine. Defects:

- ``vanishing``: a deep sigmoid network initialised with tiny weights (its gradients vanish);
- ``flat``: learning rate 0 (the loss does not decrease, the weights do not change);
- ``exploding``: a huge learning rate (the weights and loss become infinite / NaN).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
from numpy_training import (
    SGD,
    Adam,
    Linear,
    MSELoss,
    Net,
    NumpyHook,
    ReLU,
    Sigmoid,
    regression_data,
    train_step,
)

import smdebug
from smdebug.rules import VanishingGradient

FEATURES = 8
DEFECTS = (None, "vanishing", "flat", "exploding")


def _model(defect, rng) -> Net:
    if defect == "vanishing":
        layers = []
        for i in range(6):
            layers += [(str(2 * i), Linear(FEATURES, FEATURES, rng, std=1e-3)), (str(2 * i + 1), Sigmoid())]
        return Net("Sequential", [*layers, ("12", Linear(FEATURES, 1, rng))])
    return Net("Sequential", [("0", Linear(FEATURES, 16, rng)), ("1", ReLU()), ("2", Linear(16, 1, rng))])


def make_run(
    out_dir: str, defect: str | None = None, steps: int = 24, seed: int = 0, pause: float = 0
) -> None:
    """Train ``steps`` steps with the hook saving weights, gradients and losses at every step (pausing
    ``pause`` seconds after each, for a run that is still being written while it is read)."""
    x, y = regression_data(features=FEATURES, seed=seed)
    model = _model(defect, np.random.default_rng(seed))
    lr = {"flat": 0.0, "exploding": 1e6}.get(defect, 0.01)
    hook = NumpyHook(
        out_dir=out_dir,
        save_config=smdebug.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "losses"],
    )
    hook.set_mode(smdebug.modes.TRAIN)
    # Adam would bound the steps of a huge learning rate: plain SGD makes it diverge
    opt = SGD(lr) if defect in ("flat", "exploding") else Adam(lr)
    loss_fn = MSELoss()
    for _ in range(steps):
        train_step(hook, model, x, y, loss_fn, opt)
        time.sleep(pause)
    hook.close()


def make_sweep(root: str, n: int = 20, steps: int = 24) -> dict[str, str | None]:
    """n runs under root (``root/run-00`` ...), every fourth one healthy, the others cycling through the
    defects; returns run path -> defect."""
    runs = {}
    for i in range(n):
        defect = DEFECTS[i % len(DEFECTS)]
        path = f"{root.rstrip('/')}/run-{i:02d}"
        make_run(path, defect, steps=steps, seed=i)
        runs[path] = defect
    return runs


class DiesOnceRule(VanishingGradient):
    """vanishing_gradient whose first evaluation on a Dask worker kills that worker's process (once per
    ``marker`` file), to check that Dask runs the lost task again."""

    step_independent = True
    name = "dies_once"

    def __init__(self, base_trial, marker, threshold=0.0000001):
        super().__init__(base_trial, threshold=threshold)
        self.marker = Path(marker)

    def invoke_at_step(self, step):
        try:
            from distributed import get_worker

            get_worker()
        except (ImportError, ValueError):
            return super().invoke_at_step(step)  # not on a Dask worker
        if not self.marker.exists():
            self.marker.write_text("killed once")
            os._exit(1)
        return super().invoke_at_step(step)


if __name__ == "__main__":  # python sweep_runs.py OUT DEFECT|none STEPS PAUSE: a slow live run
    out, defect, steps, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    make_run(out, None if defect == "none" else defect, steps=steps, pause=pause)
    print("COMPLETED", flush=True)
