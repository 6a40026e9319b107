"""Activation on ``import torch`` (see ``smdebug.activation``): a hook built from the hook configuration,
and torch's global module hooks that register models and losses the first time the script calls them.

- a model is a module with parameters called outside any other module's forward (``model(x)``); it is
  registered with ``register_module`` and, as with an explicit registration, each of its forward calls
  starts a step;
- a loss is an ``nn.modules.loss._Loss`` (``nn.CrossEntropyLoss()``...) called outside a model, or any
  module without parameters called at top level that returns a single number (a custom loss module); it
  is registered with ``register_loss``.

Modules the script registers itself are left as they are. If the script creates a hook of its own, that
hook decides what is saved and the global module hooks are removed.
"""

from __future__ import annotations

import logging
import os
import sys
import weakref

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from smdebug.plugin import get_hook
from smdebug_torch.hook import Hook, _is_compiling

logger = logging.getLogger("smdebug")

_LOSS_BASE = getattr(torch.nn.modules.loss, "_Loss", torch.nn.Module)

# torch's launchers import torch but train nothing: a hook there would claim worker_0 before rank 0 could
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def is_launcher() -> bool:
    """Whether this process is torchrun or ``python -m torch.distributed.run`` (``launch``): torch is
    imported while ``-m`` looks the module up, before ``sys.argv[0]`` names it, so the command line decides."""
    argv = getattr(sys, "orig_argv", None) or sys.argv
    if os.path.basename(sys.argv[0] if sys.argv else "") == "torchrun":
        return True
    return any(a == "-m" and b in _LAUNCHER_MODULES for a, b in zip(argv, argv[1:]))


def activate(json_config_path: str | None = None) -> Hook | None:
    """A hook from the configuration, capturing models and losses without registration calls; none in
    torch's launcher, whose ranks (the processes it starts) each activate."""
    if is_launcher():
        logger.info("smdebug: not activating torch in its launcher %s: its ranks save the run", sys.argv[0])
        return None
    hook = Hook.create_from_json_file(json_config_path)
    if hook is not None:
        AutoRegistration(hook).install()
    return hook


class AutoRegistration:
    """torch's global forward pre-hook and forward hook, classifying each module called at top level."""

    def __init__(self, hook: Hook):
        self.hook = hook
        self._depth = 0  # module forward calls in progress (shared by threads, as DataParallel's replicas)
        self._seen: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._handles: list = []

    def install(self) -> None:
        self._handles = [register_module_forward_pre_hook(self._before)]
        try:  # always_call: count the call as finished even when its forward raised
            self._handles.append(register_module_forward_hook(self._after, always_call=True))
        except TypeError:  # torch < 2.1
            self._handles.append(register_module_forward_hook(self._after))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- torch's global hooks: called for every module, so the common path is a few comparisons --------
    def _before(self, module, inputs):
        if _is_compiling():  # inside a graph being compiled: nothing to decide, nothing to count
            return None
        self._depth += 1
        if self._depth == 1 and module not in self._seen:
            self._classify(module, inputs, None, before=True)
        return None

    def _after(self, module, inputs, output):
        if _is_compiling():
            return None
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0 and module not in self._seen:
            self._classify(module, inputs, output, before=False)
        return None

    def _classify(self, module, inputs, output, before: bool) -> None:
        hook = self.hook
        try:
            if hook.closed or get_hook() is not hook:
                # the script closed the hook or made its own: it decides from now on
                self.remove()
                return
            if module in hook._module_names or module in hook._models:
                self._seen.add(module)  # registered by the script (or part of a registered model)
            elif before:
                self._register_before(module, inputs)
            else:
                self._register_after(module, inputs, output)
        except Exception as exc:  # never break training
            self._seen.add(module)
            hook.warn_once(
                f"auto:{type(module).__name__}",
                "smdebug: could not register %s automatically: %s: %s",
                module._get_name(),
                type(exc).__name__,
                exc,
            )

    def _register_before(self, module, inputs) -> None:
        # torch collected this call's pre-hooks before this one ran: start what they would have started.
        hook = self.hook
        if isinstance(module, _LOSS_BASE):
            self._seen.add(module)
            hook.register_loss(module)
            hook._on_loss_forward(module, inputs)
        elif next(module.parameters(), None) is not None:
            self._seen.add(module)
            hook.register_module(module)
            logger.info("smdebug: registered %s as a model", module._get_name())
            if module in hook._models:  # else a compiled wrapper whose inner module starts the step
                hook._on_model_forward(module, inputs)
        # else: decided after the call, from what it returns

    def _register_after(self, module, inputs, output) -> None:
        self._seen.add(module)
        if isinstance(output, torch.Tensor) and output.numel() == 1 and output.is_floating_point():
            hook = self.hook
            hook.register_loss(module)
            hook._on_loss_forward(module, inputs)
            hook._on_module_output(module, inputs, output)  # this call's forward hooks are already done
