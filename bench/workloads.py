"""Benchmark workloads, run the same way in our venv and in the real smdebug 1.0.34's venv.

    python bench/workloads.py <workload> '<json arguments>'

Every workload prints one JSON line (its figures) as the last line of stdout. Only the API both
implementations share is used (``smdebug.pytorch``, ``smdebug.trials.create_trial``); the only
difference is the writer's memory bound, which smdebug 1.0.34 does not have.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from importlib import metadata


def implementation() -> str:
    try:
        return "smdebug " + metadata.version("smdebug")
    except metadata.PackageNotFoundError:
        return "ours " + metadata.version("smdebug-core")


def _torch():
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    return torch


def _cnn(torch):
    nn = torch.nn

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
            self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
            self.fc1 = nn.Linear(16 * 7 * 7, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
            x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
            return self.fc2(torch.relu(self.fc1(x.flatten(1))))

    return CNN()


def _mlp(torch, sizes):
    nn = torch.nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < len(self.layers) - 1:
                    x = torch.relu(x)
            return x

    return MLP()


def _hook(config: str, out_dir: str, **ours_only):
    import smdebug.pytorch as smd

    every_step = dict(
        include_collections=["weights", "biases", "gradients", "losses"],
        save_config=smd.SaveConfig(save_interval=1),
    )
    if config == "default":
        kwargs = {}
    elif config == "raw":
        kwargs = every_step
    elif config == "reductions":
        kwargs = dict(
            every_step, reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"])
        )
    elif config == "gradient_reductions":
        kwargs = dict(
            include_collections=["gradients"],
            save_config=smd.SaveConfig(save_interval=1),
            reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"]),
        )
    elif config == "health":  # ours only: every step's statistics, nothing saved between save steps
        kwargs = dict(health=True) if implementation().startswith("ours") else {}
    elif config == "weights":
        kwargs = dict(include_collections=["weights", "biases"], save_config=smd.SaveConfig(save_interval=1))
    else:
        raise ValueError(f"unknown hook config {config!r}")
    if implementation().startswith("ours"):
        kwargs.update(ours_only)
    return smd.Hook(out_dir=out_dir, **kwargs)


def _trainer(torch, model, batches, keep_grads=False):
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=not keep_grads)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return step, loss_fn


def _deep_mlp(torch, depth: int):
    """``depth`` linear layers 64 wide (2 x depth parameter tensors), ReLU between them."""
    return _mlp(torch, [64] * depth + [10])


def overhead(
    config: str,
    out_dir: str,
    steps: int = 300,
    block: int = 10,
    warmup: int = 20,
    model: str = "cnn",
    depth: int = 100,
) -> dict:
    """Step time with and without the hook, in one process: two identical models (the small CNN, or with
    model "mlp" a ``depth``-layer MLP) trained in alternating blocks of ``block`` steps (the order flips
    every block), one of them registered with the hook."""
    torch = _torch()
    if model == "mlp":
        batches = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(8)]
        plain, hooked = _deep_mlp(torch, depth), _deep_mlp(torch, depth)
    else:
        batches = [(torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))) for _ in range(8)]
        plain, hooked = _cnn(torch), _cnn(torch)
    hooked.load_state_dict(plain.state_dict())
    plain_step, _ = _trainer(torch, plain, batches)
    hooked_step, loss_fn = _trainer(torch, hooked, batches)
    hook = _hook(config, out_dir)
    hook.register_module(hooked)
    hook.register_loss(loss_fn)
    for i in range(warmup):
        plain_step(i)
        hooked_step(i)
    clock = time.perf_counter
    plain_s, hooked_s = [], []
    for b in range(steps // block):
        order = [(plain_step, plain_s), (hooked_step, hooked_s)]
        for fn, times in order if b % 2 == 0 else order[::-1]:
            t0 = clock()
            for i in range(b * block, (b + 1) * block):
                fn(i)
            times.append(clock() - t0)
    t0 = clock()
    hook.close()
    return {
        "plain_s": plain_s,
        "hooked_s": hooked_s,
        "close_s": clock() - t0,
        "block": block,
        "parameters": len(list(hooked.parameters())),
    }


def fsdp_overhead(config: str, out_dir: str, steps: int = 100, block: int = 10, warmup: int = 10) -> dict:
    """The overhead workload under FSDP2 (fully_shard) on 2 gloo CPU ranks (ours only: smdebug 1.0 has no
    sharded capture): each rank trains two identical sharded MLPs in alternating blocks, one registered
    with the hook (include_workers="all"), every step saving the weights' and gradients' reductions
    ("reductions") or their raw shards ("raw")."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = f"{out_dir}.result.json"
    mp.spawn(_fsdp_rank, args=(port, config, out_dir, steps, block, warmup, result), nprocs=2)
    with open(result) as f:
        return json.load(f)


def _fsdp_rank(rank, port, config, out_dir, steps, block, warmup, result) -> None:
    import torch.distributed as dist

    torch = _torch()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.fsdp import fully_shard

    import smdebug.pytorch as smd

    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = _mlp(torch, [256, 256, 256, 256, 10])
        for layer in model.layers:
            fully_shard(layer)
        models.append(fully_shard(model))
    plain, hooked = models
    g = torch.Generator().manual_seed(rank)
    batches = [
        (torch.randn(32, 256, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(4)
    ]
    plain_step, _ = _trainer(torch, plain, batches)
    hooked_step, loss_fn = _trainer(torch, hooked, batches)
    every_step = dict(save_config=smd.SaveConfig(save_interval=1), include_workers="all")
    collections = ["weights", "biases", "gradients"]
    if config == "reductions":
        rc = smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"])
        hook = smd.Hook(out_dir=out_dir, include_collections=collections, reduction_config=rc, **every_step)
    else:
        hook = smd.Hook(out_dir=out_dir, include_collections=collections, **every_step)
    hook.register_module(hooked)
    hook.register_loss(loss_fn)
    for i in range(warmup):
        plain_step(i)
        hooked_step(i)
    clock = time.perf_counter
    plain_s, hooked_s = [], []
    for b in range(steps // block):
        order = [(plain_step, plain_s), (hooked_step, hooked_s)]
        for fn, times in order if b % 2 == 0 else order[::-1]:
            dist.barrier()
            t0 = clock()
            for i in range(b * block, (b + 1) * block):
                fn(i)
            times.append(clock() - t0)
    hook.close()
    if rank == 0:
        params = len(list(hooked.parameters()))
        with open(result, "w") as f:
            json.dump({"plain_s": plain_s, "hooked_s": hooked_s, "block": block, "parameters": params}, f)
    dist.barrier()
    dist.destroy_process_group()


def write_run(out_dir: str, steps: int = 1000) -> dict:
    """A run with weights, biases, gradients and the loss saved at every step (13 tensors a step)."""
    torch = _torch()
    batches = [(torch.randn(32, 20), torch.randint(0, 4, (32,))) for _ in range(8)]
    model = _mlp(torch, [20, 64, 64, 4])
    step, loss_fn = _trainer(torch, model, batches)
    hook = _hook("raw", out_dir)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    hook.close()
    return {"steps": steps, "seconds": time.perf_counter() - t0}


def read(path: str, steps_per_tensor: int | None = None) -> dict:
    """Open a trial and read every value (or the values of the first ``steps_per_tensor`` steps of every
    tensor, to bound a slow reader's time)."""
    from smdebug.trials import create_trial

    clock = time.perf_counter
    t0 = clock()
    trial = create_trial(path)
    names = trial.tensor_names()
    steps = trial.steps()
    t_open = clock() - t0
    total = 0
    for name in names:
        total += len(trial.tensor(name).steps())
    read_values = 0
    checksum = 0.0
    t0 = clock()
    for name in names:
        tensor = trial.tensor(name)
        for s in tensor.steps()[:steps_per_tensor]:
            checksum += float(tensor.value(s).sum())
            read_values += 1
    t_read = clock() - t0
    return {
        "open_s": t_open,
        "read_s": t_read,
        "values_read": read_values,
        "values_total": total,
        "tensors": len(names),
        "steps": len(steps),
        "checksum": checksum,
    }


def memory(
    out_dir: str,
    hooked: bool,
    steps: int,
    width: int,
    layers: int,
    bound: int,
    batch: int = 8,
    keep_grads=False,
) -> dict:
    """Peak RSS of training a large MLP (its weights and biases saved every step when ``hooked``).

    With ``keep_grads`` the gradients stay allocated between steps (zeroed, not freed), so the weights
    are copied for the writer while the gradients are alive and the writer's copies add to the peak."""
    torch = _torch()
    model = _mlp(torch, [width] * (layers + 1))
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    batches = [(torch.randn(batch, width), torch.randint(0, width, (batch,))) for _ in range(2)]
    step, loss_fn = _trainer(torch, model, batches, keep_grads=keep_grads)
    hook = None
    if hooked:
        hook = _hook("weights", out_dir, max_queue_bytes=bound)
        hook.register_module(model)
        hook.register_loss(loss_fn)
    rss_setup = _rss_now()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    if hook is not None:
        hook.close()
    seconds = time.perf_counter() - t0
    saved = 0
    for root, _, files in os.walk(out_dir):
        saved += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return {
        "param_bytes": param_bytes,
        "rss_setup": rss_setup,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "seconds": seconds,
        "saved_bytes": saved,
    }


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def write_sweep(root: str, runs: int = 40, steps: int = 200) -> dict:
    """A sweep: ``runs`` runs of a small MLP (20-32-4), weights, biases, gradients and the loss saved at
    every step; learning rates vary, every fifth run has learning rate 0 (its loss does not decrease)."""
    torch = _torch()
    t0 = time.perf_counter()
    for i in range(runs):
        torch.manual_seed(i)
        batches = [(torch.randn(32, 20), torch.randint(0, 4, (32,))) for _ in range(4)]
        model = _mlp(torch, [20, 32, 4])
        loss_fn = torch.nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.0 if i % 5 == 4 else 0.01 * (1 + i % 4))
        hook = _hook("raw", f"{root}/run-{i:03d}")
        hook.register_module(model)
        hook.register_loss(loss_fn)
        for s in range(steps):
            x, y = batches[s % len(batches)]
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        hook.close()
    return {"runs": runs, "steps": steps, "seconds": time.perf_counter() - t0}


def sweep(root: str, runs: int, workers: int) -> dict:
    """Every built-in rule over the first ``runs`` runs of a sweep: in this process (workers 1) or on a
    LocalCluster of ``workers`` processes (its start-up timed apart). Ours only (smdebug 1.0.34 has no
    such command: it ran one processing job per rule and training job)."""
    import hashlib

    import pandas  # noqa: F401 (imported before the clock starts, as local_client has the workers' done)

    from smdebug.rules.sweep import _warm_up, evaluate_runs, find_runs, local_client

    _warm_up()  # what local_client has each worker import and load

    paths = find_runs(root)[:runs]
    client, startup = None, 0.0
    if workers > 1:
        t0 = time.perf_counter()
        client, _ = local_client(workers)
        startup = time.perf_counter() - t0
    try:
        before = client.run(_cpu_s) if client else {}
        cpu0, t0 = _cpu_s(), time.perf_counter()
        df = evaluate_runs(paths, client=client)
        seconds, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        after = client.run(_cpu_s) if client else {}
    finally:
        if client is not None:
            cluster = client.cluster
            client.close()
            cluster.close()
    digest = hashlib.sha256(df.to_json(orient="records").encode()).hexdigest()[:16]
    return {
        "runs": len(paths),
        "workers": workers,
        "seconds": seconds,
        "startup_s": startup,
        "rows": len(df),
        "fired": int((df["status"] == "fired").sum()),
        "errors": int((df["status"] == "error").sum()),
        "first_errors": sorted({str(e)[:200] for e in df["error"] if e})[:3],
        "fired_by_rule": df[df["status"] == "fired"]["rule"].value_counts().to_dict(),
        "digest": digest,  # the same table whatever ran it
        "cpu_s": cpu,  # this process (with a cluster: the client and the scheduler)
        "worker_cpu_s": sorted(after[w] - before[w] for w in after),
    }


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


WORKLOADS = {
    "overhead": overhead,
    "fsdp_overhead": fsdp_overhead,
    "write_run": write_run,
    "read": read,
    "memory": memory,
    "write_sweep": write_sweep,
    "sweep": sweep,
}

if __name__ == "__main__":
    name, args = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    result = WORKLOADS[name](**args)
    result["implementation"] = implementation()
    print(json.dumps(result))
