"""toyml: a toy training-loop framework in pure numpy (it knows nothing of smdebug).

    import toyml
    model = toyml.Linear(3, 1)
    toyml.fit(model, x, y, epochs=5, lr=0.1, callbacks=[...])

Its values are ``toyml.Array`` objects. Callbacks (passed to ``fit`` or added for every ``fit`` with
``add_global_callback``) see each step: ``on_step_begin(step)`` and ``on_step_end(step, logs)`` where
``logs`` holds the model's ``params`` and ``grads`` (dicts of Arrays) and the step's ``loss``.
"""

from __future__ import annotations

import numpy as np

__version__ = "1.3.0"

_global_callbacks: list = []


class Array:
    """The framework's own value type (no ``__array__``: converting it is the plugin's job)."""

    def __init__(self, data):
        self.data = np.array(data, dtype=np.float64)

    @property
    def shape(self):
        return self.data.shape

    def max(self) -> float:
        return float(self.data.max())

    def abs(self) -> Array:
        return Array(np.abs(self.data))

    def __repr__(self):
        return f"toyml.Array({self.data.tolist()})"


class Linear:
    """y = x @ weight + bias, trained with mean squared error."""

    def __init__(self, n_in: int, n_out: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.params = {"weight": Array(rng.normal(0, 0.5, (n_in, n_out))), "bias": Array(np.zeros(n_out))}

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x @ self.params["weight"].data + self.params["bias"].data

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray) -> tuple[Array, dict]:
        err = self.forward(x) - y
        loss = float(np.mean(err**2))
        d = 2 * err / err.size
        grads = {"weight": Array(x.T @ d), "bias": Array(d.sum(axis=0))}
        return Array(loss), grads


def add_global_callback(callback) -> None:
    """Call this callback in every ``fit`` from now on."""
    _global_callbacks.append(callback)


def fit(model: Linear, x, y, epochs: int = 1, lr: float = 0.1, batch_size: int = 16, callbacks=()):
    """Plain mini-batch gradient descent; returns the loss of each step."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    callbacks = [*_global_callbacks, *callbacks]
    history, step = [], 0
    for _ in range(epochs):
        for start in range(0, len(x), batch_size):
            for cb in callbacks:
                cb.on_step_begin(step)
            used = dict(model.params)
            loss, grads = model.loss_and_grads(x[start : start + batch_size], y[start : start + batch_size])
            for name, grad in grads.items():
                model.params[name] = Array(used[name].data - lr * grad.data)
            for cb in callbacks:
                cb.on_step_end(step, {"params": used, "grads": grads, "loss": loss})
            history.append(float(loss.data))
            step += 1
    return history
