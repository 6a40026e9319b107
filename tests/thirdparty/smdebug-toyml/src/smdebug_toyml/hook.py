"""The toyml hook: a toyml callback that hands each step's values to smdebug's BaseHook."""

from __future__ import annotations

from smdebug.plugin import BaseHook, CollectionKeys

GRADIENT_PREFIX = "gradients/"


class Hook(BaseHook):
    framework = "toyml"
    builtin_patterns = {
        CollectionKeys.WEIGHTS: "^weight$",
        CollectionKeys.BIASES: "^bias$",
        CollectionKeys.GRADIENTS: f"^{GRADIENT_PREFIX}",
        CollectionKeys.LOSSES: "^loss$",
    }
    default_include_collections = (CollectionKeys.LOSSES,)

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
