"""``smdebug.core.modes``: the same ModeKeys as ``smdebug.modes``."""

from smdebug.modes import ALLOWED_MODES, EVAL, GLOBAL, PREDICT, TRAIN, ModeKeys, to_mode

__all__ = ["ModeKeys", "TRAIN", "EVAL", "PREDICT", "GLOBAL", "ALLOWED_MODES", "to_mode"]
