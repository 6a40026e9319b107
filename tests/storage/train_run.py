"""Real (tiny) PyTorch training with the smdebug hook, run as a subprocess by the storage tests.

    python train_run.py OUT_DIR STEPS [--sleep SECONDS] [--no-close] [--go FILE]

Saves weights, biases, gradients and losses at every step and prints "step N SECONDS" once step N's
forward, backward and update are done (SECONDS: how long the step took, the hook's work included). Without --no-close it calls hook.close(); with it, the interpreter's exit must flush. With --go it prints
"ready" and creates the hook only once FILE exists (to start several processes together).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn

import smdebug.pytorch as smd


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("steps", type=int)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--no-close", action="store_true")
    parser.add_argument("--go")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    loss_fn = nn.MSELoss()
    if args.go:
        print("ready", flush=True)
        while not os.path.exists(args.go):
            time.sleep(0.001)
    hook = smd.Hook(
        out_dir=args.out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses"],
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        began = time.perf_counter()
        x = torch.randn(32, 8)
        loss = loss_fn(model(x), torch.zeros(32, 4))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} {time.perf_counter() - began:.4f}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    if not args.no_close:
        hook.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
