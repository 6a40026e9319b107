"""Real (tiny) PyTorch training with the smdebug hook, run as a subprocess by the storage tests.

    python train_run.py OUT_DIR STEPS [--sleep SECONDS] [--no-close]

Saves weights, biases, gradients and losses at every step and prints "step N" once step N's forward and
backward are done. Without --no-close it calls hook.close(); with it, the interpreter's exit must flush.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    loss_fn = nn.MSELoss()
    hook = smd.Hook(
        out_dir=args.out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses"],
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x = torch.randn(32, 8)
        loss = loss_fn(model(x), torch.zeros(32, 4))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    if not args.no_close:
        hook.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
