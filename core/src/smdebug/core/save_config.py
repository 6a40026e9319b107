"""``smdebug.core.save_config``: the same SaveConfig and SaveConfigMode as ``smdebug``."""

from smdebug.config import SaveConfig, SaveConfigMode

__all__ = ["SaveConfig", "SaveConfigMode"]
