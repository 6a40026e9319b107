"""The models, data and training loop shared by the sharded ranks (sharded_worker.py) and the unsharded
reference run the tests make in their own process: same initial weights, same global batch."""

import torch
from torch import nn

import smdebug.pytorch as smd

STEPS = 3
REDUCTIONS = ["min", "max", "mean", "std", "variance", "sum", "prod", "median"]
ABS_REDUCTIONS = ["min", "max", "mean", "std", "variance", "sum"]
NORMS = ["l1", "l2"]


class MLP(nn.Module):
    def __init__(self, hidden=5):  # FSDP2: 5 rows, uneven shards on 2 ranks (3 and 2)
        super().__init__()
        self.fc1 = nn.Linear(6, hidden)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden, 3)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


class Block(nn.Module):
    """A small pre-norm transformer block with a classification head."""

    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.mlp(self.ln2(x))
        return self.head(x.mean(1))


def make(kind):
    torch.manual_seed(0)  # the same initial weights in every process
    # tensor parallel: a hidden size both ranks' column and row shards split evenly
    return {"mlp": MLP, "block": Block, "tp": lambda: MLP(hidden=8)}[kind]()


def batch(kind, rank, step):
    """A rank's batch (tensor parallel: every rank sees the same one)."""
    g = torch.Generator().manual_seed(1000 * step + (0 if kind == "tp" else rank))
    x = torch.randn(4, 5, 8, generator=g) if kind == "block" else torch.randn(4, 6, generator=g)
    return x, torch.randint(0, 3, (4,), generator=g)


def global_batch(kind, step, world=2):
    if kind == "tp":
        return batch(kind, 0, step)
    parts = [batch(kind, r, step) for r in range(world)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def hook(out_dir, **kwargs):
    return smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses"],
        reduction_config=smd.ReductionConfig(
            reductions=REDUCTIONS,
            abs_reductions=ABS_REDUCTIONS,
            norms=NORMS,
            abs_norms=NORMS,
            save_raw_tensor=True,
        ),
        **kwargs,
    )


def train(model, hook_, data, steps=STEPS):
    """SGD on the batches ``data(step)`` gives; the hook sees model and loss."""
    criterion = nn.CrossEntropyLoss()
    hook_.register_loss(criterion)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = data(step)
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
    hook_.close()


def train_accumulating(model, hook_, data, steps=2 * STEPS):
    """Gradient accumulation: two forward and backward passes (two hook steps) per optimizer step, the
    gradients zeroed between the first pass's forward and backward."""
    criterion = nn.CrossEntropyLoss()
    hook_.register_loss(criterion)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = data(step)
        loss = criterion(model(x), y)
        if step % 2 == 0:
            opt.zero_grad()
        loss.backward()
        if step % 2 == 1:
            opt.step()
    hook_.close()


def reference_run(kind, out_dir, trainer=train):
    """The unsharded model trained on the global batches, in this process."""
    model = make(kind)
    h = hook(out_dir)
    h.register_module(model)
    trainer(model, h, lambda step: global_batch(kind, step))
