"""Training phases. Values match smdebug's ModeKeys, which are stored in event files."""

import sys
import types
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


class _ModesModule(types.ModuleType):
    """The reference calls ``smdebug.modes`` (and ``smdebug.<framework>.modes``) the modes enum, which it
    is in smdebug 1.0: this module also iterates, indexes, calls and isinstance-checks as ModeKeys."""

    def __iter__(self):
        return iter(ModeKeys)

    def __len__(self):
        return len(ModeKeys)

    def __contains__(self, item):
        return item in ModeKeys

    def __getitem__(self, name):
        return ModeKeys[name]

    def __call__(self, value):
        return ModeKeys(value)

    def __instancecheck__(self, obj):
        return isinstance(obj, ModeKeys)


sys.modules[__name__].__class__ = _ModesModule
