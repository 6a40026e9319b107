"""One rank of a 2-process gloo DDP job (RANK etc. in the environment) that a stop signal stops: rank 0
writes it at step 20, as `smdebug rules --watch` would. Prints the step after which the rank stopped.

    python stop_worker.py OUT_DIR
"""

import datetime
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import smdebug.pytorch as smd
from smdebug.exceptions import StopTraining
from smdebug.stop_signal import write_stop_signal

torch.set_num_threads(1)
dist.init_process_group(
    "gloo", timeout=datetime.timedelta(seconds=30)
)  # (a rank left alone fails, not hangs)
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Linear(4, 2)
hook = smd.Hook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=1000), include_workers="all")
hook.register_module(model)
net = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
try:
    for step in range(2000):
        if rank == 0 and step == 20:
            write_stop_signal(sys.argv[1], "watch", step)
        if (
            rank == 1 and step == 5
        ):  # its looks for the signal (every 50 ms) are from then on 25 ms after rank 0's
            time.sleep(0.025)
        opt.zero_grad()
        net(torch.randn(3, 4)).sum().backward()
        opt.step()
        time.sleep(0.002)
    print("completed")
except StopTraining:
    print(f"stopped after step {hook.step - 1}")
hook.close()
dist.barrier()
dist.destroy_process_group()
