"""Zero code change: with a hook configuration present, ``import mxnet`` attaches a hook to Gluon.

``Block.__call__`` is wrapped once. The first block with parameters a script calls at the top level (not
from inside another block) that is not a loss is registered as the model, and every loss block called at the top level
is registered as a loss, before that call runs: the first step is saved as in a script that registered
them itself. Blocks the script registered itself are left as they are.
"""

from __future__ import annotations

import functools
import threading

from smdebug.plugin import get_hook


def _is_model(block) -> bool:
    """A block with parameters, not a data transform (gluon.data.vision.transforms.ToTensor is a block
    a script calls at the top level too, before its model)."""
    if type(block).__module__.startswith("mxnet.gluon.data"):
        return False
    return bool(list(block.collect_params().keys()))


class _Attacher:
    def __init__(self, hook, gluon):
        self.hook = hook
        self.gluon = gluon
        self.local = threading.local()  # block calls in progress, per thread
        self.model_seen = False

    def before(self, block) -> None:
        hook = self.hook
        if hook.closed or block in hook.registered or get_hook() is not hook:
            return  # (a hook the script made itself decides from then on)
        if isinstance(block, self.gluon.loss.Loss):
            hook.register_block(block)
        elif not self.model_seen and not hook.models and _is_model(block):
            self.model_seen = True
            hook.register_block(block)

    def wrap(self, call):
        attacher = self

        @functools.wraps(call)
        def __call__(block, *args):
            depth = getattr(attacher.local, "depth", 0)
            if depth == 0:
                try:
                    attacher.before(block)
                except Exception as exc:  # never break the script's forward pass
                    attacher.hook.warn_once("attach", "smdebug: could not register %s: %s", block, exc)
            attacher.local.depth = depth + 1
            try:
                return call(block, *args)
            finally:
                attacher.local.depth = depth

        __call__.smdebug_wrapped = True
        return __call__


def activate(mxnet):
    """Build the hook from the JSON configuration and attach it to every Gluon block call."""
    from smdebug_mxnet.hook import Hook

    hook = Hook.create_from_json_file()
    if hook is None:
        return None
    block_class = mxnet.gluon.Block
    if not getattr(block_class.__call__, "smdebug_wrapped", False):
        block_class.__call__ = _Attacher(hook, mxnet.gluon).wrap(block_class.__call__)
    return hook
