"""Parsing of rule parameters, which arrive as strings when rules are configured the SageMaker way.

Every error names the rule, the parameter and the value, e.g.
``VanishingGradient: parameter threshold='abc' is not a number``.
"""

from __future__ import annotations

import math
import re

from smdebug.exceptions import SMDebugValueError
from smdebug.modes import ModeKeys, to_mode


def _bad(rule: str, name: str, value, what: str) -> SMDebugValueError:
    return SMDebugValueError(f"{rule}: parameter {name}={value!r} {what}")


def _blank(value) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null"))


def to_float(rule: str, name: str, value, *, low=None, high=None, optional: bool = False) -> float | None:
    if optional and _blank(value):
        return None
    if isinstance(value, bool):
        raise _bad(rule, name, value, "is not a number")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise _bad(rule, name, value, "is not a number") from None
    if math.isnan(number):
        raise _bad(rule, name, value, "is not a number")
    _check_range(rule, name, value, number, low, high)
    return number


def to_int(rule: str, name: str, value, *, low=None, high=None, optional: bool = False) -> int | None:
    if optional and _blank(value):
        return None
    if isinstance(value, bool):
        raise _bad(rule, name, value, "is not an integer")
    try:
        if isinstance(value, float) and value.is_integer():
            number = int(value)
        else:
            number = int(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise _bad(rule, name, value, "is not an integer") from None
    _check_range(rule, name, value, number, low, high)
    return number


def _check_range(rule, name, value, number, low, high) -> None:
    if low is not None and number < low:
        raise _bad(rule, name, value, f"is out of range (must be >= {low})")
    if high is not None and number > high:
        raise _bad(rule, name, value, f"is out of range (must be <= {high})")


def to_bool(rule: str, name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise _bad(rule, name, value, "is not a boolean (True or False)")


def to_list(rule: str, name: str, value) -> list[str]:
    """A list, or a comma-separated string; items are trimmed and empty ones dropped."""
    if _blank(value):
        return []
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple, set)):
        items = list(value)
    else:
        raise _bad(rule, name, value, "is not a list or a comma-separated string")
    return [str(item).strip() for item in items if str(item).strip()]


def to_regex_list(rule: str, name: str, value) -> list[str]:
    """Name patterns (a list, or comma-separated); each must compile."""
    patterns = to_list(rule, name, value)
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _bad(rule, name, value, f"is not a valid regular expression: {exc}") from None
    return patterns


def to_number_list(rule: str, name: str, value) -> list[float]:
    items = to_list(rule, name, value)
    out = []
    for item in items:
        try:
            out.append(float(item))
        except ValueError:
            raise _bad(rule, name, value, f"holds {item!r}, which is not a number") from None
    return out


def to_range_or_none(rule: str, name: str, value) -> tuple[float, float] | None:
    """A (low, high) pair: a tuple or list of two numbers, or a string such as "(-9.4999, 9.4999)"."""
    if _blank(value):
        return None
    text = value.strip().strip("()[]") if isinstance(value, str) else value
    numbers = to_number_list(rule, name, text)
    if len(numbers) != 2 or not numbers[0] < numbers[1]:
        raise _bad(rule, name, value, "is not a (low, high) pair with low < high")
    return numbers[0], numbers[1]


def to_mode_or_none(rule: str, name: str, value) -> ModeKeys | None:
    if _blank(value):
        return None
    try:
        return to_mode(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise _bad(rule, name, value, "is not a mode (TRAIN, EVAL, PREDICT or GLOBAL)") from None
