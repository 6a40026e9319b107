"""When to save (SaveConfig, SaveConfigMode) and what to save (ReductionConfig).

The JSON forms (``to_json``/``from_json``, ``to_json_dict``/``from_dict``) are smdebug 1.0's, so smdebug
can read the collections files we write and we can read its. Every bad value raises ConfigError naming the
field and the value.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import math
import numbers
import os
import re
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from smdebug.exceptions import ConfigError, ConfigTypeError, did_you_mean
from smdebug.modes import ModeKeys, to_mode
from smdebug.reductions import ALLOWED_NORMS, ALLOWED_REDUCTIONS

DEFAULT_SAVE_INTERVAL = 500
BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs")  # object stores: a URI names a bucket first
SAVE_CONFIG_KEYS = ("save_interval", "save_steps", "start_step", "end_step")
# Every name the SageMaker "reductions" parameter takes (smdebug also writes norms as "l1_norm").
REDUCTION_NAMES = (
    *ALLOWED_REDUCTIONS,
    *ALLOWED_NORMS,
    *(f"abs_{n}" for n in ALLOWED_REDUCTIONS),
    *(f"abs_{n}" for n in ALLOWED_NORMS),
)


# -- value parsers shared with json_config (configs pass every value as a string) ---------------------
def _invalid(field: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{field}: invalid value {value!r} (expected {expected})")


def _wrong_type(field: str, value: Any, expected: str) -> ConfigTypeError:
    return ConfigTypeError(f"{field}: invalid value {value!r} (expected {expected})")


def _check_keys(params: dict, allowed: tuple[str, ...], owner: str) -> None:
    for key, value in params.items():
        if key not in allowed:
            raise ConfigError(
                f"{owner}.{key}: unknown key with value {value!r} (expected {', '.join(allowed)})"
            )


def to_bool(value: Any, field: str = "value") -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise _invalid(field, value, "true or false")


def to_int(value: Any, field: str = "value", minimum: int = 0) -> int:
    """An int, or a string holding one (bools and floats are refused: they are mistakes here)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        result = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        result = int(value)
    else:
        result = None
    if result is None or result < minimum:
        raise _invalid(field, value, "a positive integer" if minimum == 1 else "a non-negative integer")
    return result


def to_float(value: Any, field: str = "value", minimum: float = 0.0) -> float:
    """A finite number at least ``minimum``, or a string holding one (bools are refused)."""
    try:
        result = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        result = None
    if result is None or not math.isfinite(result) or result < minimum:
        raise _invalid(field, value, f"a number of at least {minimum:g}")
    return result


def to_str_list(value: Any, field: str = "value") -> list[str]:
    """A list of strings, or one comma-separated string; blanks are dropped."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple, set)) or not all(isinstance(x, str) for x in items):
        raise _wrong_type(field, value, "a list of strings or a comma-separated string")
    return [x.strip() for x in items if x.strip()]


def to_regex_list(value: Any, field: str = "include_regex") -> list[str]:
    """to_str_list of regular expressions, each checked (a bad one would otherwise fail when training
    starts)."""
    patterns = to_str_list(value, field)
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{field}: invalid regular expression {pattern!r} ({exc})") from None
    return patterns


def to_steps(value: Any, field: str = "save_steps") -> list[int]:
    """Sorted, de-duplicated steps from a list (any iterable: a range, a numpy array), a single step or a
    string like "3,7"."""
    if value is None:
        return []
    if isinstance(value, str):
        items = [x for x in value.split(",") if x.strip()]
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        items = list(value)
    else:
        items = [value]
    try:
        return sorted({to_int(x, field) for x in items})
    except ConfigError:
        raise _invalid(field, value, "a list of non-negative integers") from None


def _loads(json_str: str | None, owner: str) -> Any:
    """A JSON configuration's value (None for None, "" or "null"); ConfigError when it is not JSON."""
    if json_str is None or (isinstance(json_str, str) and not json_str.strip()):
        return None
    try:
        return json.loads(json_str)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{owner}.from_json: invalid JSON {json_str!r} ({exc})") from None


# -- edits: a hook knows its idle steps are still idle while no save configuration changed ---------------
edits = [0]  # bumped by every change to a save configuration or to a hook's collections


def edited() -> None:
    edits[0] += 1


class _Steps(list):
    """save_steps: a list whose in-place changes (``append``...) count as edits of the configuration."""


def _counted(method):
    def edit(self, *args):
        result = method(self, *args)
        edits[0] += 1
        return result

    return edit


for _name in (
    "append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse",
    "__setitem__", "__delitem__", "__iadd__", "__imul__",
):  # fmt: skip
    setattr(_Steps, _name, _counted(getattr(list, _name)))


def named_arguments(init):
    """A constructor whose mistyped keyword argument is a TypeError naming the nearest one it takes
    (``SaveConfig(save_intreval=3)``: did you mean 'save_interval'?), where Python names none."""
    names = [n for n in inspect.signature(init).parameters if n != "self"]

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        for name in kwargs:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f" (it takes {', '.join(names)})"
                raise TypeError(f"{type(self).__name__} got an unexpected argument {name!r}{hint}")
        init(self, *args, **kwargs)

    return checked


# -- pydantic base: errors surface as ConfigError, assignments are validated too ------------------------
@contextmanager
def _config_errors(owner: str):
    try:
        yield
    except ValidationError as exc:
        err = exc.errors()[0]
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, ConfigError):
            raise cause from None
        where = ".".join(str(p) for p in (owner, *err["loc"]))
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{where}: unknown parameter") from None
        raise ConfigError(f"{where}: invalid value {err.get('input')!r} ({err['msg']})") from None


class ConfigModel(BaseModel):
    model_config = ConfigDict(validate_assignment=True, extra="forbid", arbitrary_types_allowed=True)

    def __init__(self, **data):
        with _config_errors(type(self).__name__):
            super().__init__(**data)

    def __setattr__(self, name, value):
        with _config_errors(type(self).__name__):
            super().__setattr__(name, value)
        edited()


# -- SaveConfigMode ---------------------------------------------------------------------------------------
class SaveConfigMode(ConfigModel):
    """When to save within one mode. None for an argument means its default."""

    save_interval: int = DEFAULT_SAVE_INTERVAL
    start_step: int = 0
    end_step: Optional[int] = None
    save_steps: list[int] = Field(default_factory=list)

    @named_arguments
    def __init__(self, save_interval=None, start_step=None, end_step=None, save_steps=None):
        super().__init__(
            save_interval=save_interval, start_step=start_step, end_step=end_step, save_steps=save_steps
        )

    @field_validator("save_interval", mode="before")
    @classmethod
    def _interval(cls, v):
        return DEFAULT_SAVE_INTERVAL if v is None else to_int(v, "SaveConfigMode.save_interval", minimum=1)

    @field_validator("start_step", mode="before")
    @classmethod
    def _start(cls, v):
        return 0 if v is None else to_int(v, "SaveConfigMode.start_step")

    @field_validator("end_step", mode="before")
    @classmethod
    def _end(cls, v):
        return None if v is None else to_int(v, "SaveConfigMode.end_step")

    @field_validator("save_steps", mode="before")
    @classmethod
    def _steps(cls, v):
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            # refused as in smdebug 1.0: a bare number is most often meant as save_interval
            raise _invalid(
                "SaveConfigMode.save_steps",
                v,
                f"a list of steps such as [{v}]; every {v} steps is save_interval={v}",
            )
        return to_steps(v, "SaveConfigMode.save_steps")

    @field_validator("save_steps", mode="after")
    @classmethod
    def _watched(cls, v):
        return _Steps(v)

    def should_save_step(self, step: int) -> bool:
        # save_steps is a union with the interval, not a replacement (reference examples).
        if step in self.save_steps:
            return True
        in_range = self.start_step <= step and (self.end_step is None or step < self.end_step)
        return in_range and step % self.save_interval == 0

    def next_save_step(self, step: int) -> int | None:
        """The first step from ``step`` on that ``should_save_step`` accepts (None: there is none)."""
        found = [s for s in self.save_steps if s >= step]
        first = max(step, self.start_step)
        first += -first % self.save_interval
        if self.end_step is None or first < self.end_step:
            found.append(first)
        return min(found, default=None)

    def saves_until(self, step: int) -> int | None:
        """After a step it saves: the first later step it does not save, or an earlier one (None: it saves
        every later step)."""
        in_range = self.start_step <= step and (self.end_step is None or step < self.end_step)
        after = self.end_step if self.save_interval == 1 and in_range else step + 1
        while after is not None and after in self.save_steps:
            after += 1
        return after

    def to_json_dict(self) -> dict:
        return {
            "save_interval": self.save_interval,
            "save_steps": list(self.save_steps),
            "start_step": self.start_step,
            "end_step": self.end_step,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_json(cls, json_str: str | None) -> SaveConfigMode:
        """The inverse of ``to_json``; an empty or null configuration gives the defaults."""
        params = _loads(json_str, "SaveConfigMode")
        return cls() if not params else cls.from_dict(params)

    @classmethod
    def from_dict(cls, params: dict | None, default_values: dict | None = None) -> SaveConfigMode | None:
        """None stays None (smdebug writes it for a mode left to the default)."""
        if params is None:
            return None
        merged = {**(default_values or {}), **params} if isinstance(params, dict) else params
        if not isinstance(merged, dict):
            raise _wrong_type("SaveConfigMode", params, "a dict")
        _check_keys(merged, SAVE_CONFIG_KEYS, "SaveConfigMode")
        return cls(**merged)


# -- SaveConfig -------------------------------------------------------------------------------------------
def _mode(key) -> ModeKeys:
    try:
        return to_mode(key)
    except ValueError:
        raise _invalid("mode_save_configs", key, "a mode: " + ", ".join(m.name for m in ModeKeys)) from None


def _broadcast(field: str) -> property:
    """A property over one SaveConfigMode field: set on every mode, read the shared (or GLOBAL) value."""

    def get(self):
        values = [getattr(c, field) for c in self._configs.values()]
        return (
            values[0]
            if all(v == values[0] for v in values)
            else getattr(self._configs[ModeKeys.GLOBAL], field)
        )

    def set(self, value):
        for cfg in self._configs.values():
            setattr(cfg, field, value)
        # Kept for the modes still to inherit a default: merge_default_save_config re-applies it.
        self._overrides[field] = getattr(self._configs[ModeKeys.GLOBAL], field)

    return property(get, set, doc=f"{field} of every mode (setting it sets it for all modes)")


class SaveConfig:
    """A SaveConfigMode per mode.

    Modes missing from ``mode_save_configs`` are *not set*: they hold SaveConfigMode() defaults until
    ``merge_default_save_config`` copies the hook's configuration into them (what a collection does).
    With ``mode_save_configs`` the other arguments, when given, are the defaults of dict-valued modes
    and the configuration of the modes not listed. ``SaveConfig(mode_save_configs={})`` leaves every
    mode to the hook.
    """

    @named_arguments
    def __init__(
        self, mode_save_configs=None, save_interval=None, start_step=None, end_step=None, save_steps=None
    ):
        args = dict(
            save_interval=save_interval, start_step=start_step, end_step=end_step, save_steps=save_steps
        )
        args = {k: v for k, v in args.items() if v is not None}
        self._configs: dict[ModeKeys, SaveConfigMode] = {m: SaveConfigMode() for m in ModeKeys}
        self._explicit: set[ModeKeys] = set()
        self._overrides: dict[str, Any] = {}
        if mode_save_configs is None:
            for mode in ModeKeys:
                self.set_save_config(mode, SaveConfigMode(**args))
            return
        if not isinstance(mode_save_configs, dict):
            raise _wrong_type("mode_save_configs", mode_save_configs, "a dict of mode -> SaveConfigMode")
        given = {_mode(k): v for k, v in mode_save_configs.items()}
        for mode in ModeKeys:
            value = given.get(mode)
            if isinstance(value, dict):
                value = SaveConfigMode.from_dict(value, args)
            if value is None and args:
                value = SaveConfigMode(**args)
            if value is not None:
                self.set_save_config(mode, value)

    save_interval = _broadcast("save_interval")
    start_step = _broadcast("start_step")
    end_step = _broadcast("end_step")
    save_steps = _broadcast("save_steps")

    @property
    def mode_save_configs(self) -> Mapping[ModeKeys, SaveConfigMode]:
        """Each mode's SaveConfigMode (smdebug 1.0's attribute); change one through its fields or
        ``set_save_config``."""
        return MappingProxyType(self._configs)

    def get_save_config(self, mode) -> SaveConfigMode:
        return self._configs[_mode(mode)]

    def set_save_config(self, mode, save_config_mode) -> None:
        if isinstance(save_config_mode, dict):
            save_config_mode = SaveConfigMode.from_dict(save_config_mode)
        if not isinstance(save_config_mode, SaveConfigMode):
            raise _wrong_type(f"save_config[{_mode(mode).name}]", save_config_mode, "a SaveConfigMode")
        # A copy: two modes (or a hook and a collection) must never share one mutable object.
        self._configs[_mode(mode)] = save_config_mode.model_copy(deep=True)
        self._explicit.add(_mode(mode))
        edited()

    def is_mode_set(self, mode) -> bool:
        """Whether the mode was configured explicitly (else it takes the default, e.g. the hook's)."""
        return _mode(mode) in self._explicit

    def merge_default_save_config(self, default: SaveConfig) -> None:
        """Give the modes not set the default's configuration (plus fields set through the properties)."""
        default = SaveConfig.parse(default)
        for mode in ModeKeys:
            if mode not in self._explicit:
                cfg = default.get_save_config(mode).model_copy(deep=True)
                for field, value in self._overrides.items():
                    setattr(cfg, field, value)
                self._configs[mode] = cfg
        edited()

    def should_save_step(self, mode, step: int) -> bool:
        return self._configs[_mode(mode)].should_save_step(step)

    def to_json_dict(self) -> dict:
        return {mode.name: self._configs[mode].to_json_dict() for mode in ModeKeys}

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_json(cls, json_str: str | None) -> SaveConfig:
        """The inverse of ``to_json``; an empty or null configuration gives the defaults."""
        params = _loads(json_str, "SaveConfig")
        return cls() if not params else cls.from_dict(params)

    @classmethod
    def from_dict(cls, params: dict | None, default_values: dict | None = None) -> SaveConfig | None:
        """smdebug's form {"TRAIN": {...} or None, ...}; a flat {"save_interval": ...} sets all modes."""
        if params is None:
            return None
        if not isinstance(params, dict):
            raise _wrong_type("save_config", params, "a dict")
        if params and all(k in SAVE_CONFIG_KEYS for k in params):
            return cls(**{**(default_values or {}), **params})
        modes = {
            k: SaveConfigMode.from_dict(v, default_values) if isinstance(v, dict) else v
            for k, v in params.items()
        }
        return cls(mode_save_configs=modes)

    @classmethod
    def from_save_config_mode(cls, save_config_mode: SaveConfigMode) -> SaveConfig:
        """Every mode configured as ``save_config_mode`` (smdebug 1.0's constructor)."""
        if not isinstance(save_config_mode, SaveConfigMode):
            raise _wrong_type("save_config_mode", save_config_mode, "a SaveConfigMode")
        return cls(mode_save_configs={mode: save_config_mode for mode in ModeKeys})

    @classmethod
    def parse(cls, obj) -> SaveConfig:
        if obj is None:
            return cls()
        if isinstance(obj, SaveConfig):
            return obj
        if isinstance(obj, SaveConfigMode):
            return cls.from_save_config_mode(obj)
        if isinstance(obj, dict):
            return cls.from_dict(obj)
        raise _wrong_type("save_config", obj, "a SaveConfig, SaveConfigMode or dict")

    def __eq__(self, other):
        if not isinstance(other, SaveConfig):
            return NotImplemented
        return self._configs == other._configs

    def __repr__(self):
        modes = ", ".join(
            f"{m.name}={self._configs[m]!r}{'' if m in self._explicit else ' (not set)'}" for m in ModeKeys
        )
        return f"SaveConfig({modes})"


# -- ReductionConfig ----------------------------------------------------------------------------------
def _names(value, field: str, allowed) -> list[str]:
    names = list(dict.fromkeys(n.lower() for n in to_str_list(value, field)))
    for name in names:
        if name not in allowed:
            raise ConfigError(
                f"{_invalid(field, name, 'one of ' + ', '.join(allowed))}{did_you_mean(name, allowed)}"
            )
    return names


REDUCTIONS_BEYOND_SMDEBUG_1 = ("median",)
EXTRA_REDUCTIONS_KEY = "more_reductions"  # in the collections file: the reductions smdebug 1.0 does not know


class ReductionConfig(ConfigModel):
    """Reductions (floats) to save instead of, or with, the raw tensor."""

    reductions: list[str] = Field(default_factory=list)
    abs_reductions: list[str] = Field(default_factory=list)
    norms: list[str] = Field(default_factory=list)
    abs_norms: list[str] = Field(default_factory=list)
    save_raw_tensor: bool = False
    save_shape: bool = False

    @named_arguments
    def __init__(
        self,
        reductions=None,
        abs_reductions=None,
        norms=None,
        abs_norms=None,
        save_raw_tensor=False,
        save_shape=False,
    ):
        super().__init__(
            reductions=reductions,
            abs_reductions=abs_reductions,
            norms=norms,
            abs_norms=abs_norms,
            save_raw_tensor=save_raw_tensor,
            save_shape=save_shape,
        )

    @field_validator("reductions", "abs_reductions", mode="before")
    @classmethod
    def _reductions(cls, v, info):
        return _names(v, f"ReductionConfig.{info.field_name}", ALLOWED_REDUCTIONS)

    @field_validator("norms", "abs_norms", mode="before")
    @classmethod
    def _norms(cls, v, info):
        return _names(v, f"ReductionConfig.{info.field_name}", ALLOWED_NORMS)

    @field_validator("save_raw_tensor", "save_shape", mode="before")
    @classmethod
    def _bools(cls, v, info):
        return False if v is None else to_bool(v, f"ReductionConfig.{info.field_name}")

    @classmethod
    def from_reductions_string(
        cls, reductions, save_raw_tensor=False, save_shape=False, field: str = "reductions"
    ) -> ReductionConfig:
        """Parse SageMaker's "reductions" parameter, e.g. "min,abs_max,l2" (or smdebug's "abs_l2_norm")."""
        lists: dict[str, list[str]] = {"reductions": [], "abs_reductions": [], "norms": [], "abs_norms": []}
        for raw in to_str_list(reductions, field):
            name = raw.lower()
            absolute = name.startswith("abs_")
            base = name[4:] if absolute else name
            if base.endswith("_norm") and base[:-5] in ALLOWED_NORMS:
                base = base[:-5]
            kind = "reductions" if base in ALLOWED_REDUCTIONS else "norms" if base in ALLOWED_NORMS else None
            if kind is None:
                raise _invalid(field, raw, "a comma-separated list of " + ", ".join(REDUCTION_NAMES))
            lists[("abs_" if absolute else "") + kind].append(base)
        return cls(**lists, save_raw_tensor=save_raw_tensor, save_shape=save_shape)

    def reduction_pairs(self) -> list[tuple[str, bool]]:
        """(name, on absolute values) to compute, without duplicates."""
        pairs = [(n, False) for n in (*self.reductions, *self.norms)]
        pairs += [(n, True) for n in (*self.abs_reductions, *self.abs_norms)]
        return list(dict.fromkeys(pairs))

    def to_json_dict(self) -> dict:
        # smdebug's form: one comma string; norms carry a "_norm" suffix there. smdebug 1.0 refuses a whole
        # run whose collections name a reduction it lacks (median), so those go under a key it ignores.
        names = [*self.reductions, *(f"{n}_norm" for n in self.norms)]
        names += [*(f"abs_{n}" for n in self.abs_reductions), *(f"abs_{n}_norm" for n in self.abs_norms)]
        extra = [n for n in names if n.removeprefix("abs_") in REDUCTIONS_BEYOND_SMDEBUG_1]
        params = {
            "save_raw_tensor": self.save_raw_tensor,
            "reductions": ",".join(n for n in names if n not in extra),
            "save_shape": self.save_shape,
        }
        return {**params, EXTRA_REDUCTIONS_KEY: ",".join(extra)} if extra else params

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_json(cls, json_str: str | None) -> ReductionConfig:
        """The inverse of ``to_json``; an empty or null configuration gives the defaults."""
        params = _loads(json_str, "ReductionConfig")
        return cls() if not params else cls.from_dict(params)

    @classmethod
    def from_dict(cls, params: dict | None) -> ReductionConfig | None:
        """smdebug's form; separate abs_reductions/norms/abs_norms lists are accepted as well."""
        if params is None:
            return None
        if not isinstance(params, dict):
            raise _wrong_type("reduction_config", params, "a dict")
        _check_keys(params, (*cls.model_fields, EXTRA_REDUCTIONS_KEY), "ReductionConfig")
        field = "ReductionConfig.reductions"
        names = to_str_list(params.get("reductions"), field) + to_str_list(
            params.get(EXTRA_REDUCTIONS_KEY), field
        )
        parsed = cls.from_reductions_string(names, field=field)
        lists = {
            k: getattr(parsed, k) + to_str_list(params.get(k), f"ReductionConfig.{k}")
            for k in ("abs_reductions", "norms", "abs_norms")
        }
        return cls(
            reductions=parsed.reductions,
            **lists,
            save_raw_tensor=params.get("save_raw_tensor", False),
            save_shape=params.get("save_shape", False),
        )


# -- HookConfig: every option of a hook -------------------------------------------------------------------
class CollectionSettings(ConfigModel):
    """What a configuration says about one collection (None: left to the collection's default)."""

    name: str
    include_regex: Optional[list[str]] = None
    save_config: Optional[SaveConfig] = None
    reduction_config: Optional[ReductionConfig] = None
    save_histogram: Optional[bool] = None

    def __init__(
        self, name, include_regex=None, save_config=None, reduction_config=None, save_histogram=None
    ):
        super().__init__(
            name=name,
            include_regex=include_regex,
            save_config=save_config,
            reduction_config=reduction_config,
            save_histogram=save_histogram,
        )

    @field_validator("include_regex", mode="before")
    @classmethod
    def _regex(cls, v):
        return None if v is None else to_regex_list(v, "CollectionSettings.include_regex")

    @field_validator("save_config", mode="before")
    @classmethod
    def _save_config(cls, v):
        return None if v is None else SaveConfig.parse(v)

    @field_validator("save_histogram", mode="before")
    @classmethod
    def _histogram(cls, v):
        return None if v is None else to_bool(v, "CollectionSettings.save_histogram")

    def apply_to(self, coll) -> None:
        """Give a hook's collection the settings this configuration has for it."""
        if self.include_regex:
            coll.include(self.include_regex)
        if self.save_config is not None:
            coll.save_config = self.save_config
        if self.reduction_config is not None:
            coll.reduction_config = self.reduction_config
        if self.save_histogram is not None:
            coll.save_histogram = self.save_histogram


def _misplaced(name: str, value: Any) -> str | None:
    """The hint for a SaveConfig or ReductionConfig setting given to a hook itself, as the JSON
    configuration's HookParameters give them (``save_interval=10``)."""
    for owner, argument, fields in (
        ("SaveConfig", "save_config", SAVE_CONFIG_KEYS),
        ("ReductionConfig", "reduction_config", tuple(ReductionConfig.model_fields)),
    ):
        close = difflib.get_close_matches(name, fields, n=1, cutoff=0.85)
        if close:
            return f"; {close[0]} is a {owner} setting: {argument}=smd.{owner}({close[0]}={value!r})"
    return None


class HookConfig(ConfigModel):
    """Every option of a hook, validated in one place: the constructor's arguments (positional in this
    order), then keyword-only ones. ``create_from_json_file``, pickled copies and plugins build from it; a
    plugin with options of its own subclasses it (its fields follow these, positionally too)."""

    KEYWORD_ONLY: ClassVar[tuple[str, ...]] = (
        "max_queue_bytes",
        "health",
        "health_steps",
        "health_loss_factor",
        "collections",
    )

    out_dir: str
    export_tensorboard: bool = False
    tensorboard_dir: Optional[str] = None
    dry_run: bool = False
    reduction_config: Optional[ReductionConfig] = None
    save_config: Optional[SaveConfig] = None
    include_regex: Optional[list[str]] = None
    include_collections: Optional[list[str]] = None
    save_all: bool = False
    include_workers: Literal["one", "all"] = "one"
    max_queue_bytes: Optional[int] = None  # the writer's bound on queued bytes (SMDEBUG_MAX_QUEUE_BYTES)
    # every step's l2 and max |x| of weights, gradients and loss in a flight recorder (smdebug.health)
    health: bool = False
    health_steps: int = 100  # the recorder's length in steps
    health_loss_factor: float = 10.0  # a loss over this factor times its recent median is a trigger
    collections: dict[str, CollectionSettings] = Field(default_factory=dict)  # from a JSON configuration

    @classmethod
    def from_arguments(cls, args: tuple, kwargs: dict) -> HookConfig:
        """Validate a hook constructor's arguments. A string include_regex or include_collections is one
        regex or one name (a regex may hold commas), as in smdebug 1.0."""
        positional = [n for n in cls.model_fields if n not in cls.KEYWORD_ONLY]
        if len(args) > len(positional):
            raise TypeError(
                f"a hook takes at most {len(positional)} positional arguments ({len(args)} given)"
            )
        values = dict(zip(positional, args))
        for name, value in kwargs.items():
            if name in values:
                raise TypeError(f"a hook got multiple values for argument {name!r}")
            if name not in cls.model_fields:
                close = difflib.get_close_matches(name, list(cls.model_fields), n=1)
                hint = _misplaced(name, value) or (f"; did you mean {close[0]!r}?" if close else "")
                raise TypeError(f"a hook got an unexpected argument {name!r}{hint}")
            values[name] = value
        for name in ("out_dir", "tensorboard_dir"):  # a pathlib.Path, as create_trial takes one
            if isinstance(values.get(name), os.PathLike):
                values[name] = os.fspath(values[name])
        if not values.get("out_dir") or not isinstance(values.get("out_dir"), str):
            raise ConfigError(f"out_dir: a path or URI is required, got {values.get('out_dir')!r}")
        for name in ("include_regex", "include_collections"):
            if isinstance(values.get(name), str):
                values[name] = [values[name]]
        rc = values.get("reduction_config")
        if rc is not None and not isinstance(rc, ReductionConfig):
            raise ConfigTypeError(f"reduction_config: expected a ReductionConfig, got {type(rc).__name__}")
        return cls(**values)

    def arguments(self) -> dict[str, Any]:
        """The constructor arguments this configuration holds (every field but ``collections``)."""
        return {name: getattr(self, name) for name in type(self).model_fields if name != "collections"}

    @field_validator("out_dir", mode="before")
    @classmethod
    def _out_dir(cls, v):
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(f"out_dir: invalid value {v!r} (expected a path or URI)")
        scheme, sep, rest = v.partition("://")
        if sep and scheme in BUCKET_SCHEMES and not rest.split("/", 1)[0]:
            # an empty bucket variable (f"s3://{bucket}/run"); "s3://" would become a local folder "s3:"
            raise ConfigError(f"out_dir: {v!r} names no bucket (expected {scheme}://bucket/prefix)")
        return v

    @field_validator("export_tensorboard", "dry_run", "health", mode="before")
    @classmethod
    def _bools(cls, v, info):
        return to_bool(v, info.field_name)

    @field_validator("save_all", mode="before")
    @classmethod
    def _save_all(cls, v):
        # smdebug 1.0 only asks whether it is truthy (``save_all=["true"]`` works there); words still parse
        return to_bool(v, "save_all") if isinstance(v, str) else bool(v)

    @field_validator("include_regex", "include_collections", mode="before")
    @classmethod
    def _lists(cls, v, info):
        if v is None:
            return None
        return (to_regex_list if info.field_name == "include_regex" else to_str_list)(v, info.field_name)

    @field_validator("save_config", mode="before")
    @classmethod
    def _save_config(cls, v):
        return None if v is None else SaveConfig.parse(v)

    @field_validator("reduction_config", mode="before")
    @classmethod
    def _reduction_config(cls, v):
        return ReductionConfig.from_dict(v) if isinstance(v, dict) else v

    @field_validator("include_workers", mode="before")
    @classmethod
    def _workers(cls, v):
        if v not in ("one", "all"):
            raise ConfigError(f"include_workers: invalid value {v!r} (expected 'one' or 'all')")
        return v

    @field_validator("max_queue_bytes", mode="before")
    @classmethod
    def _queue_bytes(cls, v):
        return None if v is None else to_int(v, "max_queue_bytes", minimum=1)

    @field_validator("health_steps", mode="before")
    @classmethod
    def _health_steps(cls, v):
        return to_int(v, "health_steps", minimum=1)

    @field_validator("health_loss_factor", mode="before")
    @classmethod
    def _health_loss_factor(cls, v):
        return to_float(v, "health_loss_factor", minimum=1.0)
