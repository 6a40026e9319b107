"""Entry-point module of the PyTorch plugin: hook implementations only, torch is not imported here."""

from __future__ import annotations

import sys

from smdebug.plugin import Framework, hookimpl


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
    from smdebug_torch.tensors import to_numpy

    return to_numpy(value)


@hookimpl
def smdebug_reduce(value, reduction, abs):
    if not _is_torch_tensor(value):
        return None
    from smdebug_torch.tensors import reduce

    return reduce(value, reduction, abs)


@hookimpl
def smdebug_reductions(values, reductions):
    if not any(_is_torch_tensor(v) for v in values):
        return None
    from smdebug_torch.tensors import reductions as start

    return start(values, reductions)


@hookimpl
def smdebug_to_host(results):
    if sys.modules.get("torch") is None:
        return None
    from smdebug_torch.tensors import to_host

    return to_host(results)


@hookimpl
def smdebug_activate(framework, module):
    # Called just after ``import torch`` when a hook configuration is present (smdebug.activation).
    from smdebug_torch.activation import activate

    return activate()
