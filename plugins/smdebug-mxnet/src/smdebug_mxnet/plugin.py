"""Entry-point module of the MXNet plugin: hook implementations only; mxnet is not imported here."""

from __future__ import annotations

import sys

from smdebug.plugin import Framework, hookimpl


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
    from smdebug_mxnet.tensors import to_numpy

    return to_numpy(value)


@hookimpl
def smdebug_reduce(value, reduction, abs):
    if not _is_ndarray(value):
        return None
    from smdebug_mxnet.tensors import reduce

    return reduce(value, reduction, abs)


@hookimpl
def smdebug_reductions(values, reductions):
    if not any(_is_ndarray(v) for v in values):
        return None
    from smdebug_mxnet.tensors import reductions as start

    return start(values, reductions)  # None for the values that are not NDArrays


@hookimpl
def smdebug_to_host(results):
    # only a step with results left on a device needs this; numpy results (the CPU's) are the core's
    mx = sys.modules.get("mxnet")
    if mx is None or not any(isinstance(r, mx.nd.NDArray) for r in results):
        return None
    from smdebug_mxnet.tensors import to_host

    return to_host(results)


@hookimpl
def smdebug_activate(framework, module):
    # Called right after `import mxnet` when a hook configuration is present.
    if framework.alias != "mxnet":
        return None
    from smdebug_mxnet.activation import activate

    return activate(module)
