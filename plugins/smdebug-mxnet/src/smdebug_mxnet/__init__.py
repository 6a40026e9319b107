"""smdebug for MXNet Gluon, also importable as ``smdebug.mxnet``.

import smdebug.mxnet as smd
hook = smd.Hook(out_dir="/tmp/run", save_config=smd.SaveConfig(save_interval=10))
hook.register_block(net)
hook.register_block(loss_fn)
"""

from smdebug.plugin import exports

# Hook, SaveConfig, create_trial, ... resolve on first use: importing this package does not import mxnet.
__getattr__, __dir__, get_hook, __all__ = exports(
    __name__, "smdebug_mxnet.hook", Collection="smdebug_mxnet.collection"
)
