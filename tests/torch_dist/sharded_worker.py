"""One rank of a real 2-process gloo job on 127.0.0.1, started by torch.multiprocessing (test_sharded.py).

Runs every scenario one after the other in one process group: FSDP2 (fully_shard) and tensor-parallel
models with the hook, and DDP with gradient_as_bucket_view=True (each rank's own gradients recorded to
<run>.expected_<rank>.json for the test to compare with the saved run).
"""

import copy
import json
import os

import torch
import torch.distributed as dist
from sharded_models import STEPS, batch, hook, make, train, train_accumulating
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import smdebug.pytorch as smd

DDP_STEPS = 20


def fsdp_mlp(rank, out_dir, register_first=True, **options):
    model = make("mlp")
    h = hook(out_dir, **options)
    if register_first:  # the hook must follow the parameters fully_shard puts in place
        h.register_module(model)
    fully_shard(model.fc1)
    fully_shard(model)
    if not register_first:
        h.register_module(model)
    train(model, h, lambda step: batch("mlp", rank, step))


def fsdp_mlp_part(rank, out_dir):
    """Only fc1 sharded (the root is not): the hook, registered first, must follow fc1's new parameters.
    Rank 0 records fc1's full weight and gradient at each step for the test."""
    model = make("mlp")
    h = hook(out_dir, include_workers="all")
    h.register_module(model)
    fully_shard(model.fc1)
    criterion = nn.CrossEntropyLoss()
    h.register_loss(criterion)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = []
    for step in range(STEPS):
        x, y = batch("mlp", rank, step)
        weight = model.fc1.weight.full_tensor().tolist()
        opt.zero_grad()
        criterion(model(x), y).backward()
        expected.append(
            {
                "MLP_fc1.weight": weight,
                "gradient/MLP_fc1.weight": model.fc1.weight.grad.full_tensor().tolist(),
            }
        )
        opt.step()
    h.close()
    if rank == 0:
        with open(f"{out_dir}.expected.json", "w") as f:
            json.dump(expected, f)


def fsdp_health_sharded_later(rank, out_dir):
    """health=True, the model sharded after step 0 (a save step) while idle steps follow: health notices
    the new parameters first, and the hook must still watch their gradients at the next save step."""
    model = make("mlp")
    h = smd.Hook(
        out_dir=out_dir,
        include_workers="all",
        include_collections=["gradients"],
        save_config=smd.SaveConfig(save_steps=[0, 3]),
        health=True,
    )
    h.register_module(model)
    criterion = nn.CrossEntropyLoss()
    h.register_loss(criterion)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        if step == 1:
            fully_shard(model.fc1)
            fully_shard(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = batch("mlp", rank, step)
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
    h.close()


def fsdp_health_trigger(rank, out_dir):
    """health=True under FSDP2, an inf in rank 1's shard of fc1's weight at step 2 (not a save step)."""
    model = make("mlp")
    h = smd.Hook(
        out_dir=out_dir,
        include_workers="all",
        include_collections=["weights", "gradients", "losses"],
        save_config=smd.SaveConfig(save_steps=[0]),
        health=True,
    )
    h.register_module(model)
    fully_shard(model.fc1)
    fully_shard(model)
    criterion = nn.CrossEntropyLoss()
    h.register_loss(criterion)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        if step == 2 and rank == 1:
            with torch.no_grad():
                model.fc1.weight.to_local()[0, 0] = float("inf")
        x, y = batch("mlp", rank, step)
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
    h.close()


def fsdp_block(rank, out_dir):
    model = make("block")
    fully_shard(model.attn)
    fully_shard(model.mlp)
    fully_shard(model)
    h = hook(out_dir, include_workers="all")
    h.register_module(model)  # after fully_shard: the class is FSDPBlock, the names stay Block_...
    train(model, h, lambda step: batch("block", rank, step))


def tensor_parallel(rank, out_dir, trainer=train, **options):
    mesh = init_device_mesh("cpu", (2,))
    model = make("tp")
    h = hook(out_dir, **options)
    h.register_module(model)  # before parallelize_module, which replaces the parameters
    parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    trainer(model, h, lambda step: batch("tp", rank, step))


def fsdp_accumulating(rank, out_dir):
    """Every pass syncs (no set_requires_gradient_sync(False)): FSDP2 adds each pass's gradient shard to
    the one there, and each pass's own must be saved."""
    model = make("mlp")
    h = hook(out_dir, include_workers="all")
    h.register_module(model)
    fully_shard(model.fc1)
    fully_shard(model)
    train_accumulating(model, h, lambda step: batch("mlp", rank, step))


def tp_dtensor_outputs(rank, out_dir):
    """fc1 and relu output DTensors (use_local_output=False), reduced at the same step as fc2's plain
    output (one reduction: torch's foreach kernel took the DTensor along with the plain tensors)."""
    mesh = init_device_mesh("cpu", (2,))
    model = make("tp")
    h = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["gradients"],
        include_regex=["fc1_output", "fc2_output"],
        include_workers="all",
        reduction_config=smd.ReductionConfig(reductions=["max"], save_raw_tensor=True),
    )
    h.register_module(model)
    parallelize_module(
        model, mesh, {"fc1": ColwiseParallel(use_local_output=False), "fc2": RowwiseParallel()}
    )
    train(model, h, lambda step: batch("tp", rank, step))


def tp_save_tensor(rank, out_dir):
    """hook.save_tensor of DTensors the script holds (fc1's column shards, and their product with the
    batch; fc2's replicated bias), on every rank at the same point: saved as sharded parameters are.
    Rank 0 records their full values for the test."""
    mesh = init_device_mesh("cpu", (2,))
    model = make("tp")
    h = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_workers="all")
    h.register_module(model)
    h.get_collection("shards").reduction_config = smd.ReductionConfig(
        reductions=["max", "mean", "median"], norms=["l2"]
    )
    parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = []
    for step in range(STEPS):
        x, y = batch("tp", rank, step)
        opt.zero_grad()
        criterion(model(x), y).backward()
        weight = model.fc1.weight.detach() * 2.0  # a DTensor, sharded as fc1's weight
        h.save_tensor("double_fc1_weight", weight)  # into "default": the raw shards
        h.save_tensor("double_fc1_weight_stats", weight, "shards")  # reductions only
        bias = model.fc2.bias.detach() * 2.0  # replicated (RowwiseParallel): whole on every rank
        h.save_tensor("double_fc2_bias_stats", bias, "shards")
        expected.append([weight.full_tensor().tolist(), bias.to_local().tolist()])
        opt.step()
    h.close()
    if rank == 0:
        with open(f"{out_dir}.expected.json", "w") as f:
            json.dump(expected, f)


def ddp_bucket_view(rank, out_dir):
    model = make("mlp")
    h = hook(out_dir, include_workers="all")
    h.register_module(model)
    criterion = nn.CrossEntropyLoss()
    h.register_loss(criterion)
    ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    expected = []
    for step in range(DDP_STEPS):
        x, y = batch("mlp", rank, step)
        local = copy.deepcopy(model)  # this rank's own gradient, before DDP averages it
        criterion(local(x), y).backward()
        expected.append({name: p.grad.tolist() for name, p in local.named_parameters()})
        opt.zero_grad()
        criterion(ddp(x), y).backward()
        opt.step()
    h.close()
    with open(f"{out_dir}.expected_{rank}.json", "w") as f:
        json.dump(expected, f)


def lazy_mlp(rank, out_dir):
    """A lazy model in a 2-rank job (each rank's own gradients are watched): its parameters materialize
    in step 0's forward pass, after the hook listed them. Records step 0's gradients for the test."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(5), nn.ReLU(), nn.LazyLinear(3))
    h = hook(out_dir, include_workers="all")
    h.register_module(model)
    criterion = nn.CrossEntropyLoss()
    h.register_loss(criterion)
    opt = None
    for step in range(STEPS):
        x, y = batch("mlp", rank, step)
        out = model(x)
        opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
        criterion(out, y).backward()
        if step == 0:
            with open(f"{out_dir}.expected_{rank}.json", "w") as f:
                json.dump({name: p.grad.tolist() for name, p in model.named_parameters()}, f)
        opt.step()
        opt.zero_grad()
    h.close()


def classic_fsdp(rank, out_dir, inner=False, orig_params=True):
    """Classic FullyShardedDataParallel: training goes on, one warning says what is saved (the wrapper
    registered, or the model inside it, registered before it was wrapped). Without use_orig_params the
    flat parameter's gradient is saved: each step's own one (this rank's, before FSDP reduces it) is
    recorded to <run>.expected_<rank>.json."""
    import logging

    from torch.distributed.fsdp import FullyShardedDataParallel

    seen = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("smdebug").addHandler(handler)
    try:
        model = make("mlp")
        h = hook(out_dir, include_workers="all")
        if inner:
            h.register_module(model)
        wrapped = FullyShardedDataParallel(model, use_orig_params=orig_params, device_id=torch.device("cpu"))
        if not inner:
            h.register_module(wrapped)
        if orig_params:
            train(wrapped, h, lambda step: batch("mlp", rank, step), steps=2)
        else:
            criterion = nn.CrossEntropyLoss()
            opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
            expected = []
            for step in range(2):
                x, y = batch("mlp", rank, step)
                with FullyShardedDataParallel.summon_full_params(wrapped):
                    local = copy.deepcopy(wrapped.module)
                nn.CrossEntropyLoss()(local(x), y).backward()
                expected.append(torch.cat([p.grad.reshape(-1) for p in local.parameters()]).tolist())
                opt.zero_grad()
                criterion(wrapped(x), y).backward()
                opt.step()
            h.close()
            with open(f"{out_dir}.expected_{rank}.json", "w") as f:
                json.dump(expected, f)
    finally:
        logging.getLogger("smdebug").removeHandler(handler)
    with open(f"{out_dir}.warnings_{rank}.json", "w") as f:
        json.dump(seen, f)


def fsdp_hook_on_rank_0(rank, out_dir):
    """The hook made on rank 0 only (a common 'log on rank 0' script): no collective of the hook's (its
    all_gather met FSDP2's own on rank 1 and gloo aborted the job); rank 0 saves its shards alone."""
    model = make("mlp")
    fully_shard(model.fc1)
    fully_shard(model)
    if rank == 0:
        h = hook(out_dir, include_workers="all")
        h.register_module(model)
        train(model, h, lambda step: batch("mlp", rank, step))
        return
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch("mlp", rank, step)
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()


def tp_rank_1_late(rank, out_dir):
    """A tensor-parallel layer whose passes run no collective (ColwiseParallel alone), rank 1 reaching
    its first step after rank 0 stopped waiting for its hook: rank 0 saves alone, and rank 1 must too
    (it found every rank's hook and entered the all_gather rank 0 never did: the job hung)."""
    import time

    from smdebug_torch import sharded

    sharded._WAIT_FOR_RANKS = 0.5  # (10 s by default)
    try:
        mesh = init_device_mesh("cpu", (2,))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8))
        h = hook(out_dir, include_workers="all")
        h.register_module(model)
        parallelize_module(model, mesh, {"0": ColwiseParallel()})
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if rank == 1:
            time.sleep(2)
        for step in range(2):
            x, _ = batch("tp", rank, step)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        h.close()
    finally:
        sharded._WAIT_FOR_RANKS = 10.0


def tp_health_nan(rank, out_dir):
    """health=True on a tensor-parallel model; at step 2 a non-finite weight on rank 1 only (fc3, a plain
    layer after the parallel ones): rank 1 looks for where it came from without running the forward pass
    again (its parallel layers' collectives, entered by rank 1 alone, hung the job)."""
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 3))
    h = smd.Hook(out_dir=out_dir, include_workers="all", health=True)
    h.register_module(model)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    criterion = nn.CrossEntropyLoss()
    h.register_loss(criterion)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        x, y = batch("tp", rank, step)
        if step == 2 and rank == 1:
            with torch.no_grad():
                model[3].weight[0, 0] = float("inf")
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
    h.close()


SCENARIOS = {
    "fsdp_mlp": lambda rank, d: fsdp_mlp(rank, d, include_workers="all"),
    "fsdp_mlp_after": lambda rank, d: fsdp_mlp(rank, d, register_first=False, include_workers="all"),
    "fsdp_mlp_one": lambda rank, d: fsdp_mlp(rank, d, include_workers="one"),
    "fsdp_mlp_part": fsdp_mlp_part,
    "fsdp_block": lambda rank, d: fsdp_block(rank, d),
    "fsdp_health_sharded_later": fsdp_health_sharded_later,
    "fsdp_health_trigger": fsdp_health_trigger,
    "tp_mlp": lambda rank, d: tensor_parallel(rank, d, include_workers="all"),
    "fsdp_accumulating": fsdp_accumulating,
    "tp_accumulating": lambda rank, d: tensor_parallel(
        rank, d, trainer=train_accumulating, include_workers="all"
    ),
    "tp_mlp_gathered": lambda rank, d: tensor_parallel(
        rank, d, include_workers="all", gather_full_tensors=True
    ),
    "tp_dtensor_outputs": tp_dtensor_outputs,
    "tp_save_tensor": tp_save_tensor,
    "ddp_bucket_view": ddp_bucket_view,
    "lazy_mlp": lazy_mlp,
    "classic_fsdp": classic_fsdp,
    "classic_fsdp_inner": lambda rank, d: classic_fsdp(rank, d, inner=True),
    "tp_health_nan": tp_health_nan,
    "classic_fsdp_flat_inner": lambda rank, d: classic_fsdp(rank, d, inner=True, orig_params=False),
    "tp_rank_1_late": tp_rank_1_late,
    # last: the ranks number the hooks that capture sharded tensors, and this one is made on rank 0 only
    "fsdp_hook_on_rank_0": fsdp_hook_on_rank_0,
}


def main(rank, port, base_dir, names):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for name in names:
            SCENARIOS[name](rank, os.path.join(base_dir, name))
            dist.barrier()
    finally:
        dist.destroy_process_group()
