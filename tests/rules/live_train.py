"""A training script for the sidecar tests: ``python live_train.py OUT bad|good STEPS``.

Trains slowly (a pause per step) so that ``smdebug rules --watch`` can follow it; prints COMPLETED, or
STOPPED <step> <rule> when the hook stopped training.
"""

import sys
import time

import rule_scenarios as sc
import torch
from torch import nn

from smdebug.exceptions import StopTraining

torch.set_num_threads(1)


def main(out, kind, steps):
    torch.manual_seed(0)
    x, y = sc.regression_data()
    model, loss_fn = sc.MLP(), nn.MSELoss()
    hook = sc.make_hook(out)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=1e6 if kind == "bad" else 0.01)
    try:
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            time.sleep(0.15)
        print("COMPLETED", flush=True)
    except StopTraining as exc:
        print(f"STOPPED {hook.step} {exc.rule_name}", flush=True)
    finally:
        hook.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
