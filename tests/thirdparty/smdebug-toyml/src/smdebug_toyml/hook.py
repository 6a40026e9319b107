"""The toyml hook: a toyml callback that hands each step's values to smdebug's BaseHook."""

from __future__ import annotations

from smdebug.collection import CollectionKeys
from smdebug.hook import BaseHook

GRADIENT_PREFIX = "gradients/"


class Hook(BaseHook):
    framework = "toyml"
    default_include_collections = (CollectionKeys.LOSSES,)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.get_collection(CollectionKeys.WEIGHTS).include("^weight$")
        self.get_collection(CollectionKeys.BIASES).include("^bias$")
        self.get_collection(CollectionKeys.GRADIENTS).include(f"^{GRADIENT_PREFIX}")
        self.get_collection(CollectionKeys.LOSSES).include("^loss$")

    # toyml's callback protocol
    def on_step_begin(self, step: int) -> None:
        self.begin_step()

    def on_step_end(self, step: int, logs: dict) -> None:
        for name, value in logs["params"].items():
            self.save_for_step(name, value)
        for name, value in logs["grads"].items():
            self.save_for_step(GRADIENT_PREFIX + name, value)
        self.save_for_step("loss", logs["loss"])
        self.end_step()
