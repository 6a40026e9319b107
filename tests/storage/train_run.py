"""Real (tiny) training with the core's hook, in plain numpy (tests/numpy_training.py), run as a
subprocess by the storage tests.

    python train_run.py OUT_DIR STEPS [--sleep SECONDS] [--no-close] [--go FILE]

Saves weights, biases, gradients and losses at every step and prints "step N SECONDS" once step N's
forward, backward and update are done (SECONDS: how long the step took, the hook's work included). Without
--no-close it calls hook.close(); with it, the interpreter's exit must flush. With --go it prints "ready"
and creates the hook only once FILE exists (to start several processes together).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from numpy_training import SGD, Linear, MSELoss, Net, NumpyHook, ReLU, train_step

import smdebug


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("steps", type=int)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--no-close", action="store_true")
    parser.add_argument("--go")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    model = Net("Sequential", [("0", Linear(8, 16, rng)), ("1", ReLU()), ("2", Linear(16, 4, rng))])
    if args.go:
        print("ready", flush=True)
        while not os.path.exists(args.go):
            time.sleep(0.001)
    hook = NumpyHook(
        out_dir=args.out_dir,
        save_config=smdebug.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses"],
    )
    opt, loss_fn = SGD(lr=0.01), MSELoss()
    for step in range(args.steps):
        began = time.perf_counter()
        x = rng.standard_normal((32, 8)).astype(np.float32)
        train_step(hook, model, x, np.zeros((32, 4), np.float32), loss_fn, opt)
        print(f"step {step} {time.perf_counter() - began:.4f}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    if not args.no_close:
        hook.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
