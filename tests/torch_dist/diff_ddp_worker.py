"""One rank of a tiny 2-process gloo DDP job (started by test_diff_ddp.py, as torchrun would):

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python diff_ddp_worker.py OUT_DIR

Each rank sees its own data; DistributedDataParallel keeps the replicas' weights equal.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import smdebug.pytorch as smd


def main(out_dir, steps=4):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial model on every rank
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "losses"],
        include_workers="all",
    )
    hook.register_module(model)
    criterion = nn.CrossEntropyLoss()
    hook.register_loss(criterion)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * rank + step)
        x, y = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)
        opt.zero_grad()
        criterion(ddp(x), y).backward()
        opt.step()
    hook.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    assert "RANK" in os.environ, "start through test_diff_ddp.py (or torchrun)"
    main(sys.argv[1])
