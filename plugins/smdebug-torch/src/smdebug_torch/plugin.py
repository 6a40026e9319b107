"""Entry-point module of the PyTorch plugin: hook implementations only, torch is not imported here."""

from __future__ import annotations

import importlib
import sys

from smdebug.plugin import Framework, hookimpl


def _tensors():
    # imported on first use, then found in sys.modules: a `from ... import` in each call would cost more
    # than a small tensor's conversion
    return sys.modules.get("smdebug_torch.tensors") or importlib.import_module("smdebug_torch.tensors")


def _is_torch_tensor(value) -> bool:
    # torch cannot have made the value if it was never imported; the isinstance check stays cheap.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


@hookimpl
def smdebug_framework():
    return Framework(
        alias="pytorch",
        package="smdebug_torch",
        import_names=("torch",),
        distribution="torch",
        supported=">=2.0",
    )


@hookimpl
def smdebug_to_numpy(value):
    if not _is_torch_tensor(value):
        return None
    return _tensors().to_numpy(value)


@hookimpl
def smdebug_host_view(value):
    if not _is_torch_tensor(value):
        return None
    return _tensors().host_view(value)


@hookimpl
def smdebug_reduce(value, reduction, abs):
    if not _is_torch_tensor(value):
        return None
    return _tensors().reduce(value, reduction, abs)


@hookimpl
def smdebug_reductions(values, reductions):
    # (called twice a step, a step's weights and gradients: torch looked up once, not once a value)
    torch = sys.modules.get("torch")
    if torch is None or not any(isinstance(v, torch.Tensor) for v in values):
        return None
    return _tensors().reductions(values, reductions)


@hookimpl
def smdebug_to_host(results):
    if sys.modules.get("torch") is None:
        return None
    return _tensors().to_host(results)


@hookimpl
def smdebug_activate(framework, module):
    # Called just after ``import torch`` when a hook configuration is present (smdebug.activation).
    from smdebug_torch.activation import activate

    return activate()
