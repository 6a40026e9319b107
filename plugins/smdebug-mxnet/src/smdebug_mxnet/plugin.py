"""Entry-point module of the MXNet plugin: hook implementations only; mxnet is not imported here."""

from __future__ import annotations

import importlib
import sys

from smdebug.plugin import Framework, hookimpl


def _tensors():
    # imported on first use, then found in sys.modules: a `from ... import` in each call would cost more
    # than a small tensor's conversion
    return sys.modules.get("smdebug_mxnet.tensors") or importlib.import_module("smdebug_mxnet.tensors")


def _is_ndarray(value) -> bool:
    # Nothing can be an NDArray before mxnet was imported, so this never imports mxnet.
    mx = sys.modules.get("mxnet")
    return mx is not None and isinstance(value, mx.nd.NDArray)


@hookimpl
def smdebug_framework():
    return Framework(
        alias="mxnet",
        package="smdebug_mxnet",
        import_names=("mxnet",),
        distributions=("mxnet", "mxnet-mkl", "mxnet-cu112", "mxnet-native"),
        supported=">=1.6,<2",
    )


@hookimpl
def smdebug_to_numpy(value):
    if not _is_ndarray(value):
        return None
    return _tensors().to_numpy(value)


@hookimpl
def smdebug_host_view(value):
    if not _is_ndarray(value):
        return None
    return _tensors().host_memory(value)


@hookimpl
def smdebug_reduce(value, reduction, abs):
    if not _is_ndarray(value):
        return None
    return _tensors().reduce(value, reduction, abs)


@hookimpl
def smdebug_reductions(values, reductions):
    if not any(_is_ndarray(v) for v in values):
        return None
    return _tensors().reductions(values, reductions)  # None for the values that are not NDArrays


@hookimpl
def smdebug_to_host(results):
    # only a step with results left on a device needs this; numpy results (the CPU's) are the core's
    mx = sys.modules.get("mxnet")
    if mx is None or not any(isinstance(r, mx.nd.NDArray) for r in results):
        return None
    return _tensors().to_host(results)


@hookimpl
def smdebug_activate(framework, module):
    # Called right after `import mxnet` when a hook configuration is present.
    if framework.alias != "mxnet":
        return None
    from smdebug_mxnet.activation import activate

    return activate(module)
