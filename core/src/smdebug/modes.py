"""Training phases. Values match smdebug's ModeKeys, which are stored in event files."""

from enum import Enum


class ModeKeys(Enum):
    TRAIN = 1
    EVAL = 2
    PREDICT = 3
    GLOBAL = 4


TRAIN = ModeKeys.TRAIN
EVAL = ModeKeys.EVAL
PREDICT = ModeKeys.PREDICT
GLOBAL = ModeKeys.GLOBAL
ALLOWED_MODES = list(ModeKeys)


def to_mode(value) -> ModeKeys:
    """Accept a ModeKeys, its name in any case ("train", "TRAIN") or its number."""
    if isinstance(value, ModeKeys):
        return value
    if isinstance(value, str) and value.upper() in ModeKeys.__members__:
        return ModeKeys[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return ModeKeys(value)
        except ValueError:
            pass
    raise ValueError(f"invalid mode {value!r}: expected one of {', '.join(m.name for m in ModeKeys)}")
