"""Numbers read from environment variables (sizes, timeouts): a bad value is warned about once, naming
the variable, and the default is used; it never stops training or a command."""

from __future__ import annotations

import logging
import math
import os

logger = logging.getLogger("smdebug")
_warned: set = set()


def env_number(name: str, default: float, *, integer: bool = False, positive: bool = False) -> float:
    """``$name`` as a number (an integer when ``integer``; ``1e9`` is one), else ``default``: unset, empty,
    or not a finite number >= 0 (> 0 when ``positive``), which is warned about once."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value >= 0 and (value > 0 or not positive):
        if not integer:
            return value
        if value == int(value):
            return int(value)
    if (name, raw) not in _warned:
        _warned.add((name, raw))
        kind = "integer" if integer else "number"
        logger.warning(
            "smdebug: %s=%r is not a %s %s; using the default, %s",
            name,
            raw,
            "positive" if positive else "non-negative",
            kind,
            default,
        )
    return default
