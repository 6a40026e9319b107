"""Entry-point module of the TensorFlow plugin: hook implementations only, TensorFlow is not imported here."""

from __future__ import annotations

import sys

from smdebug.plugin import Framework, hookimpl


def _is_tf_value(value) -> bool:
    # nothing can be a TensorFlow value before TensorFlow is imported; the check stays cheap
    if sys.modules.get("tensorflow") is None:
        return False
    from smdebug_tf.tensors import is_tf_value

    return is_tf_value(value)


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
    from smdebug_tf.tensors import to_numpy

    return to_numpy(value)


@hookimpl
def smdebug_reduce(value, reduction, abs):
    if not _is_tf_value(value):
        return None
    from smdebug_tf.tensors import reduce

    return reduce(value, reduction, abs)


@hookimpl
def smdebug_reductions(values, reductions):
    if sys.modules.get("tensorflow") is None:
        return None
    from smdebug_tf.tensors import reductions as start

    started = start(values, reductions)
    return started if any(s is not None for s in started) else None


@hookimpl
def smdebug_to_host(results):
    if sys.modules.get("tensorflow") is None:
        return None
    from smdebug_tf.tensors import to_host

    return to_host(results)


@hookimpl
def smdebug_activate(framework, module):
    # Called once, just after `import tensorflow` or `import keras`, when a hook configuration is present.
    if framework.alias != "tensorflow":
        return None
    from smdebug_tf.activation import activate

    return activate()
