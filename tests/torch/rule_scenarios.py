"""Tiny real PyTorch trainings, healthy or with one defect planted, saved with the smdebug hook.

Each scenario takes the output folder and ``bad`` (plant the defect or not) and trains a few steps of a
small model on fixed data (full batch, single thread), so runs are fast and deterministic.
"""

from __future__ import annotations

import time

import torch
from torch import nn

import smdebug.pytorch as smd
from smdebug.exceptions import StopTraining

FEATURES = 8


class MLP(nn.Module):
    def __init__(self, hidden=16, out=1, act=nn.ReLU, inputs=FEATURES):
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.relu = act()  # named as smdebug's default regexes expect: relu_output_0, relu_input_0
        self.fc2 = nn.Linear(hidden, out)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


class DeepSigmoid(nn.Module):
    def __init__(self, depth=6, width=FEATURES, init_std=None):
        super().__init__()
        self.layers = nn.Sequential(
            *[m for _ in range(depth) for m in (nn.Linear(width, width), nn.Sigmoid())]
        )
        self.out = nn.Linear(width, 1)
        if init_std is not None:
            for m in self.layers:
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, std=init_std)
                    nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.out(self.layers(x))


class Block(nn.Module):
    def __init__(self, inputs, outputs, std=None):
        super().__init__()
        self.fc, self.relu = nn.Linear(inputs, outputs), nn.ReLU()
        if std is None:
            nn.init.kaiming_normal_(self.fc.weight, nonlinearity="relu")
        else:
            nn.init.normal_(self.fc.weight, std=std)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        return self.relu(self.fc(x))


class TwoReluNet(nn.Module):
    """Two ReLU layers, whose inputs are saved as block1.relu_input_0 and block2.relu_input_0."""

    def __init__(self, std1=None, std2=None):
        super().__init__()
        self.block1, self.block2 = Block(FEATURES, 16, std1), Block(16, 16, std2)
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        return self.out(self.block2(self.block1(x)))


class TanhNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.tanh, self.fc2 = nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(self.tanh(self.fc1(x)))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 1)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class SeqNet(nn.Module):
    def __init__(self, vocab=20):
        super().__init__()
        self.embedding0 = nn.Embedding(vocab, 8)
        self.fc = nn.Linear(8, 1)

    def forward(self, tokens):
        return self.fc(self.embedding0(tokens).mean(1))


def regression_data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    return x, x @ w + 0.1 * torch.randn(n, 1, generator=g)


def blobs(n=300, classes=3, seed=0, counts=None, separation=6.0):
    """Gaussian blobs; well separated by default, so a classifier learns them perfectly in a few steps."""
    g = torch.Generator().manual_seed(seed)
    centers = separation * torch.eye(classes, FEATURES)
    counts = counts or [n // classes] * classes
    y = torch.cat([torch.full((c,), k, dtype=torch.long) for k, c in enumerate(counts)])
    x = centers[y] + torch.randn(len(y), FEATURES, generator=g)
    return x, y


def make_hook(out, include=("weights", "gradients", "losses"), extra=None):
    hook = smd.Hook(
        out_dir=out,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=[*include, *(extra or {})],
    )
    for name, regex in (extra or {}).items():
        hook.get_collection(name).include(regex)
    return hook


def train(
    out,
    model,
    x,
    y,
    *,
    loss=None,
    steps=12,
    lr=0.05,
    optimizer="sgd",
    include=("weights", "gradients", "losses"),
    extra=None,
    hook=None,
    pause_at=None,
    pause=0.0,
    close=True,
):
    torch.manual_seed(0)
    loss_fn = loss or nn.MSELoss()
    hook = hook or make_hook(out, include, extra)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr)
    try:
        for step in range(steps):
            if step == pause_at:
                time.sleep(pause)
            opt.zero_grad()
            value = loss_fn(model(x), y)
            value.backward()
            opt.step()
    except StopTraining:
        hook.close()
        raise
    if close:
        hook.close()
    return hook


# -- one scenario per rule (bad=True plants the defect) ------------------------------------------------
def vanishing_gradient(out, bad):
    torch.manual_seed(0)
    x, y = regression_data()
    model = DeepSigmoid(init_std=1e-3) if bad else MLP()
    train(out, model, x, y, steps=4)


def exploding_tensor(out, bad):
    torch.manual_seed(0)
    x, y = regression_data()
    train(out, MLP(), x, y, steps=10, lr=1e6 if bad else 0.05)


def weight_update_ratio(out, bad):
    torch.manual_seed(0)
    x, y = regression_data()
    train(out, MLP(), x, y, steps=5, lr=1e-12 if bad else 0.05)


def all_zero(out, bad):
    torch.manual_seed(0)
    x, y = regression_data()
    model = MLP()
    if bad:  # every ReLU unit is off for every input
        nn.init.constant_(model.fc1.bias, -100.0)
    train(out, model, x, y, steps=4, extra={"relu_output": ".*relu_output"})


def unchanged_tensor(out, bad):
    torch.manual_seed(0)
    x, y = regression_data()
    model = MLP()
    if bad:
        model.fc1.requires_grad_(False)  # a frozen layer
    train(out, model, x, y, steps=5)


def loss_not_decreasing(out, bad):
    torch.manual_seed(0)
    x, y = regression_data()
    train(out, MLP(), x, y, steps=22, lr=0.0 if bad else 0.01, optimizer="adam")


def dead_relu(out, bad):
    all_zero(out, bad)


def tensor_variance(out, bad):
    torch.manual_seed(0)
    x, y = regression_data()
    model = MLP()
    if bad:
        nn.init.normal_(model.fc1.weight, std=10.0)  # variance 100
    train(out, model, x, y, steps=3)


def poor_weight_initialization(out, bad):
    torch.manual_seed(0)
    x, y = regression_data()
    model = TwoReluNet(std1=1.0, std2=1e-3) if bad else TwoReluNet()
    train(out, model, x, y, steps=8, lr=0.01, optimizer="adam", extra={"relu_input": ".*relu_input"})


def saturated_activation(out, bad):
    torch.manual_seed(0)
    x, y = regression_data()
    model = TanhNet()
    if bad:
        with torch.no_grad():
            model.fc1.weight.mul_(1e4)  # inputs of tanh far out in its flat tails
    train(out, model, x, y, steps=3, lr=1e-4, extra={"tanh_input": ".*tanh_input"})


def check_input_images(out, bad):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    images = torch.rand(16, 3, 8, 8, generator=g)  # pixels in [0, 1]: mean 0.5
    if not bad:
        images = (images - 0.5) / 0.29  # normalised
    y = torch.randn(16, 1, generator=g)
    train(out, ConvNet(), images, y, steps=5, lr=0.01, extra={"input_image": ".*ConvNet_input_0"})


def nlp_sequence_ratio(out, bad):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 20, (16, 12), generator=g)
    if bad:
        tokens[:, 3:] = 0  # mostly padding
    y = torch.randn(16, 1, generator=g)
    train(out, SeqNet(), tokens, y, steps=3, lr=0.01, extra={"input_sequence": ".*embedding0_input_0"})


def _classifier(out, bad_labels=False, counts=None):
    torch.manual_seed(0)
    x, y = blobs()
    model = MLP(out=3)
    hook = train(
        out, model, x, y, loss=nn.CrossEntropyLoss(), steps=30, lr=0.05, optimizer="adam", close=False
    )
    xe, ye = blobs(seed=1, counts=counts)
    if bad_labels:  # labels that do not match the inputs
        ye = torch.randint(0, 3, ye.shape, generator=torch.Generator().manual_seed(2))
    hook.set_mode(smd.modes.EVAL)
    with torch.no_grad():
        predictions = model(xe).argmax(1)
    hook.save_tensor("labels", ye, "labels")
    hook.save_tensor("predictions", predictions, "predictions")
    hook.close()


def confusion(out, bad):
    _classifier(out, bad_labels=bad)


def class_imbalance(out, bad):
    _classifier(out, counts=[570, 20, 10] if bad else [200, 200, 200])


def overfit(out, bad):
    """Rounds of training then evaluation. The defect: a tiny training set with random labels that a big
    model memorises, so its validation loss stays high while its training loss falls."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if bad:
        x, y = torch.randn(8, FEATURES, generator=g), torch.randint(0, 3, (8,), generator=g)
        xe, ye = torch.randn(64, FEATURES, generator=g), torch.randint(0, 3, (64,), generator=g)
    else:  # overlapping classes and a small model: neither loss goes to zero, and both stay close
        x, y = blobs(n=1500, seed=0, separation=1.5)
        xe, ye = blobs(n=1500, seed=1, separation=1.5)
    model = MLP(hidden=64, out=3) if bad else nn.Linear(FEATURES, 3)
    loss_fn = nn.CrossEntropyLoss()
    hook = make_hook(out, include=("losses",))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(3):
        hook.set_mode(smd.modes.TRAIN)
        for _ in range(10):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        hook.set_mode(smd.modes.EVAL)
        with torch.no_grad():
            for _ in range(2):
                loss_fn(model(xe), ye)
    hook.close()


def overtraining(out, bad):
    """The defect: training goes on long after the loss stopped improving."""
    torch.manual_seed(0)
    x, y = regression_data()
    train(out, nn.Linear(FEATURES, 1), x, y, steps=60 if bad else 10, lr=0.1, optimizer="adam")


def similar_across_runs(out, bad, other):
    """Two runs of the same training; the defect: the second was seeded differently."""
    for path, seed in ((other, 0), (out, 1 if bad else 0)):
        torch.manual_seed(seed)
        x, y = regression_data()
        train(path, MLP(), x, y, steps=3)


def stalled_training(out, bad):
    """The defect: training pauses for seconds between two steps."""
    torch.manual_seed(0)
    x, y = regression_data()
    train(out, MLP(), x, y, steps=6, pause_at=3 if bad else None, pause=4.0, include=("losses",))
