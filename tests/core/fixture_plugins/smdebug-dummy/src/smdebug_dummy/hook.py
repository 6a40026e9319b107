import numpy as np

from smdebug.hook import BaseHook


class DummyTensor:
    """A framework value the core cannot convert by itself."""

    def __init__(self, values):
        self.values = list(values)
        self.reduced_here = 0


class Hook(BaseHook):
    framework = "dummy"
    default_include_collections = ("losses",)


def to_numpy(value):
    return np.array(value.values, dtype=np.float32)
