"""smdebug for PyTorch, also importable as ``smdebug.pytorch``.

import smdebug.pytorch as smd
hook = smd.Hook(out_dir="/tmp/run", save_config=smd.SaveConfig(save_interval=10))
hook.register_module(model)
hook.register_loss(criterion)
"""

from smdebug.plugin import exports

# Hook, SaveConfig, create_trial, ... resolve on first use: importing this package stays cheap.
__getattr__, __dir__, get_hook, __all__ = exports(
    __name__, "smdebug_torch.hook", Collection="smdebug_torch.collection"
)
