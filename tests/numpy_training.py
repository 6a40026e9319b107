"""Tiny networks trained in plain numpy and saved with the core's own hook, no framework: the fixture runs
of the storage, analysis, rules and Dask suites, whose tests are about the core, not about PyTorch.

``NumpyHook`` is a framework plugin's hook in miniature (builtin collection patterns, ``save_for_step``
at the points a framework shows its tensors). Tensors are named as smdebug's PyTorch hook names a model's:
``Net_fc1.weight``, ``gradient/Net_fc1.weight``, ``Net_relu_output_0``, ``MSELoss_output_0``.

    net = Net("Net", [("fc1", Linear(4, 8)), ("relu", ReLU()), ("fc2", Linear(8, 3))])
    hook = NumpyHook(out_dir=..., include_collections=["weights", "gradients", "losses"])
    train(hook, net, x, y, loss=CrossEntropyLoss(), steps=6)
"""

from __future__ import annotations

import numpy as np

from smdebug.hook import BaseHook


class NumpyHook(BaseHook):
    framework = "numpy"
    builtin_patterns = {  # the torch plugin's, so that runs read the same
        "weights": "^(?!gradient).*weight",
        "biases": "^(?!gradient).*bias",
        "gradients": "^gradient",
        "losses": "[Ll]oss_(?!input).*output",
    }
    default_include_collections = ("losses",)


class Linear:
    """y = x @ weight.T + bias, initialised as torch's nn.Linear (uniform in +-1/sqrt(inputs))."""

    def __init__(self, inputs: int, outputs: int, rng: np.random.Generator | None = None, std=None):
        rng = rng or np.random.default_rng(0)
        bound = 1 / np.sqrt(inputs)
        if std is None:
            weight = rng.uniform(-bound, bound, (outputs, inputs))
        else:
            weight = rng.normal(0, std, (outputs, inputs))
        bias = rng.uniform(-bound, bound, outputs) if std is None else np.zeros(outputs)
        self.params = {"weight": weight.astype(np.float32), "bias": bias.astype(np.float32)}
        self.frozen = False

    def forward(self, x):
        self.x = x
        return x @ self.params["weight"].T + self.params["bias"]

    def backward(self, grad):
        self.grads = {"weight": grad.T @ self.x, "bias": grad.sum(axis=0)}
        return grad @ self.params["weight"]


class _Activation:
    params: dict = {}
    frozen = True

    def forward(self, x):
        self.y = self.f(x)
        return self.y


class ReLU(_Activation):
    f = staticmethod(lambda x: np.maximum(x, 0))

    def backward(self, grad):
        return grad * (self.y > 0)


class Sigmoid(_Activation):
    f = staticmethod(lambda x: 1 / (1 + np.exp(-x)))

    def backward(self, grad):
        return grad * self.y * (1 - self.y)


class Tanh(_Activation):
    f = staticmethod(np.tanh)

    def backward(self, grad):
        return grad * (1 - self.y**2)


class Net:
    """Layers applied in order; ``name`` is the model's class name in the tensor names."""

    def __init__(self, name: str, layers):
        self.name, self.layers = name, list(layers)

    def named_parameters(self):
        return [
            (f"{self.name}_{lname}.{pname}", layer, pname)
            for lname, layer in self.layers
            for pname in layer.params
        ]

    def forward(self, x, hook=None):
        for lname, layer in self.layers:
            x = layer.forward(x)
            if hook is not None:
                hook.save_for_step(f"{self.name}_{lname}_output_0", x)
        return x

    def backward(self, grad):
        for _, layer in reversed(self.layers):
            grad = layer.backward(grad)


class MSELoss:
    name = "MSELoss"

    def __call__(self, out, y):
        self.err = out - y
        return np.float32(np.mean(self.err**2))

    def backward(self):
        return 2 * self.err / self.err.size


class CrossEntropyLoss:
    name = "CrossEntropyLoss"

    def __call__(self, out, y):
        shifted = out - out.max(axis=1, keepdims=True)
        self.p = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
        self.y = y
        return np.float32(-np.mean(np.log(self.p[np.arange(len(y)), y])))

    def backward(self):
        grad = self.p.copy()
        grad[np.arange(len(self.y)), self.y] -= 1
        return grad / len(self.y)


class SGD:
    def __init__(self, lr):
        self.lr = lr

    def step(self, net):
        for _, layer, pname in net.named_parameters():
            if not layer.frozen:
                layer.params[pname] = layer.params[pname] - self.lr * layer.grads[pname]


class Adam:
    def __init__(self, lr, betas=(0.9, 0.999), eps=1e-8):
        self.lr, self.betas, self.eps, self.t, self.moments = lr, betas, eps, 0, {}

    def step(self, net):
        self.t += 1
        b1, b2 = self.betas
        for name, layer, pname in net.named_parameters():
            if layer.frozen:
                continue
            g = layer.grads[pname]
            m, v = self.moments.get(name, (0.0, 0.0))
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            self.moments[name] = (m, v)
            m_hat, v_hat = m / (1 - b1**self.t), v / (1 - b2**self.t)
            layer.params[pname] = layer.params[pname] - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


def train_step(hook, net, x, y, loss_fn, optimizer=None) -> float:
    """One step as a framework plugin sees it: the parameters as the step starts, the layers' outputs,
    the loss, then the gradients; the update without ``optimizer`` is none (evaluation). Overflows give
    inf and NaN silently, as in a framework."""
    with np.errstate(all="ignore"):
        return _step(hook, net, x, y, loss_fn, optimizer)


def _step(hook, net, x, y, loss_fn, optimizer) -> float:
    hook.begin_step()
    hook.raise_if_stop_requested()  # where a framework's forward call raises it
    for name, layer, pname in net.named_parameters():
        hook.save_for_step(name, layer.params[pname])
    loss = loss_fn(net.forward(x, hook), y)
    hook.save_for_step(f"{loss_fn.name}_output_0", loss)
    if optimizer is not None:
        net.backward(loss_fn.backward())
        for name, layer, pname in net.named_parameters():
            if not layer.frozen:
                hook.save_for_step("gradient/" + name, layer.grads[pname])
        optimizer.step(net)
    return float(loss)


def regression_data(n=64, features=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features)).astype(np.float32)
    w = rng.standard_normal((features, 1)).astype(np.float32)
    return x, (x @ w + 0.1 * rng.standard_normal((n, 1))).astype(np.float32)
