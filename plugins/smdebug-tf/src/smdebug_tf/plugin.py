"""Entry-point module of the TensorFlow plugin: hook implementations only, TensorFlow is not imported here."""

from __future__ import annotations

import importlib
import sys

from smdebug.plugin import Framework, hookimpl


def _tensors():
    # imported on first use, then found in sys.modules: a `from ... import` in each call would cost more
    # than a small tensor's conversion
    return sys.modules.get("smdebug_tf.tensors") or importlib.import_module("smdebug_tf.tensors")


def _is_tf_value(value) -> bool:
    # nothing can be a TensorFlow value before TensorFlow is imported; the check stays cheap
    if sys.modules.get("tensorflow") is None:
        return False
    return _tensors().is_tf_value(value)


@hookimpl
def smdebug_framework():
    return Framework(
        alias="tensorflow",
        package="smdebug_tf",
        import_names=("tensorflow", "keras"),
        distribution="tensorflow",
        distributions=(
            "tensorflow-cpu",
            "tensorflow-gpu",
            "tensorflow-intel",
            "tensorflow-macos",
            "tf-nightly",
        ),
        supported=">=2.16",
    )


@hookimpl
def smdebug_to_numpy(value):
    if not _is_tf_value(value):
        return None
    return _tensors().to_numpy(value)


@hookimpl
def smdebug_reduce(value, reduction, abs):
    if not _is_tf_value(value):
        return None
    return _tensors().reduce(value, reduction, abs)


@hookimpl
def smdebug_reductions(values, reductions):
    if sys.modules.get("tensorflow") is None:
        return None
    started = _tensors().reductions(values, reductions)
    return started if any(s is not None for s in started) else None


@hookimpl
def smdebug_to_host(results):
    if sys.modules.get("tensorflow") is None:
        return None
    return _tensors().to_host(results)


@hookimpl
def smdebug_activate(framework, module):
    # Called once, just after `import tensorflow` or `import keras`, when a hook configuration is present.
    if framework.alias != "tensorflow":
        return None
    from smdebug_tf.activation import activate

    return activate()
