"""One rank of a real 2-process gloo job (started by test_distributed.py, as torchrun would).

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python dist_worker.py OUT_DIR INCLUDE_WORKERS

Trains a DistributedDataParallel model on data that differs per rank (its first two steps accumulate
gradients), and writes what torch reported on this rank to OUT_DIR.expected_<rank>.json for the test to
compare with the saved run.
"""

import contextlib
import copy
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import smdebug.pytorch as smd


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def main(out_dir, include_workers, steps=3):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # same initial model on every rank
    model = MLP()
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "losses", "model_inputs"],
        include_workers=include_workers,
    )
    hook.register_module(model)
    hook.get_collection("model_inputs").add_module_tensors(model, inputs=True, outputs=False)
    criterion = nn.CrossEntropyLoss()
    hook.register_loss(criterion)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    expected = {"worker": hook.worker_name(), "num_workers": hook.num_workers(), "steps": []}
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * rank + step)  # each rank sees its own data
        x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
        local = copy.deepcopy(model)  # this rank's gradient before DDP averages it
        criterion(local(x), y).backward()
        record = {
            "x": x.tolist(),
            "weight": model.fc1.weight.detach().tolist(),
            "local_grad": local.fc2.bias.grad.tolist(),
        }
        # steps 0 and 1 accumulate (0 under no_sync, 1 syncs): each saves its own pass's gradient
        if step != 1:
            opt.zero_grad()
        with ddp.no_sync() if step == 0 else contextlib.nullcontext():
            loss = criterion(ddp(x), y)
            loss.backward()
        record["loss"] = loss.item()
        expected["steps"].append(record)
        if step != 0:
            opt.step()
    hook.close()
    with open(f"{out_dir}.expected_{rank}.json", "w") as f:
        json.dump(expected, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    assert "RANK" in os.environ, "start through test_distributed.py (or torchrun)"
    main(sys.argv[1], sys.argv[2])
