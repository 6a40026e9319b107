"""smdebug for toyml, also importable as ``smdebug.toyml``.

import smdebug.toyml as smd
hook = smd.Hook(out_dir="/tmp/run", save_config=smd.SaveConfig(save_interval=1))
toyml.fit(model, x, y, callbacks=[hook])
"""

from smdebug.plugin import exports

__getattr__, __dir__, get_hook, __all__ = exports(__name__, "smdebug_toyml.hook")
