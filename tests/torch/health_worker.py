"""A training script for test_health.py's cases that need a process of their own.

    python health_worker.py OUT_DIR CASE [FAULT_STEP]

CASE: "sigterm" (the script sends itself SIGTERM at FAULT_STEP), "raise" (training raises at
FAULT_STEP), "rank" (one rank of a 2-process gloo job, RANK etc. in the environment: rank 1 writes inf
into fc1's forward output at FAULT_STEP; "rank-one-writer": the same, only rank 0 saving tensors, as
include_workers="one" has it). Every step's gradient norm of fc2.weight, before the optimizer
step, goes to OUT_DIR.norms_<rank>.json as training goes.
"""

import json
import os
import signal
import sys

import torch
from torch import nn

import smdebug.pytorch as smd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main(out_dir, case, fault_step):
    torch.set_num_threads(1)
    writers = "one" if case == "rank-one-writer" else "all"
    case = "rank" if case == "rank-one-writer" else case
    rank = 0
    model = Net()
    if case == "rank":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=100),
        include_workers=writers,
        include_collections=["gradients", "losses"] if case == "rank" else None,
        health=True,
    )
    hook.register_module(model)
    criterion = nn.CrossEntropyLoss()
    hook.register_loss(criterion)
    net = model
    if case == "rank":
        net = nn.parallel.DistributedDataParallel(model)

        def plant(module, inputs, output):
            if rank == 1 and hook.step == fault_step:
                output = output.clone()
                output[0, 0] = float("inf")
                return output
            return None

        model.fc1.register_forward_hook(plant)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    norms = {}
    for step in range(8):
        g = torch.Generator().manual_seed(100 * rank + step)
        x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
        if case == "sigterm" and step == fault_step:
            os.kill(os.getpid(), signal.SIGTERM)
        if case == "raise" and step == fault_step:
            raise RuntimeError("the data loader broke")
        opt.zero_grad()
        criterion(net(x), y).backward()
        norms[step] = float(model.fc2.weight.grad.norm())
        with open(f"{out_dir}.norms_{rank}.json", "w") as f:
            json.dump(norms, f)
        opt.step()
    hook.close()
    if case == "rank":
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
