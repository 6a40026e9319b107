"""A tiny Gluon MLP trained for a few real steps, and what it looked like at each step."""

from __future__ import annotations

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

BATCH = 4


def make_net(hybridize: bool = False):
    """(net, loss block), named as in a fresh process (Gluon numbers blocks per name scope)."""
    mx.random.seed(0)
    with mx.name.NameManager():
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    net.initialize(mx.init.Xavier())
    if hybridize:
        net.hybridize()
    return net, loss_fn


def batches(n: int, seed: int = 1):
    rng = np.random.RandomState(seed)
    return [(mx.nd.array(rng.randn(BATCH, 5)), mx.nd.array(rng.randint(0, 3, BATCH))) for _ in range(n)]


class Run:
    """Trains ``net`` step by step and keeps, per global step, what the hook should have saved."""

    def __init__(self, hook, net, loss_fn):
        self.hook, self.net, self.loss_fn = hook, net, loss_fn
        self.trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        self.seen: list[dict] = []  # per global step: params, grads, loss, outputs

    def train(self, data):
        for x, y in data:
            with autograd.record():
                out = self.net(x)
                loss = self.loss_fn(out, y)
            loss.backward()
            self.trainer.step(BATCH)
            self.record(x, out, loss, grads=True)

    def evaluate(self, data):
        for x, y in data:
            out = self.net(x)
            self.record(x, out, self.loss_fn(out, y), grads=False)

    def record(self, x, out, loss, grads):
        params = {p.name: p.data().asnumpy().copy() for p in self.net.collect_params().values()}
        if grads:
            params.update(
                {f"gradient/{p.name}": p.grad().asnumpy().copy() for p in self.net.collect_params().values()}
            )
        self.seen.append({**params, "input": x.asnumpy(), "output": out.asnumpy(), "loss": loss.asnumpy()})
