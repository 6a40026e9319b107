"""The SageMaker hook configuration file (debughookconfig.json) read into a HookConfig.

Example::

    {
      "LocalPath": "/opt/ml/output/tensors",
      "S3OutputPath": "s3://bucket/prefix",
      "HookParameters": {"save_interval": "100", "train.save_interval": "10", "reductions": "min,abs_l2"},
      "CollectionConfigurations": [
        {"CollectionName": "weights", "CollectionParameters": {"save_steps": "1,2,3"}},
        {"CollectionName": "metrics", "CollectionParameters": {"end_step": "0"}}
      ],
      "TensorBoardOutputConfig": {"LocalPath": "/opt/ml/output/tensorboard"}
    }

All parameter values are strings in files SageMaker writes; JSON numbers, booleans and lists are
accepted as well. Unknown parameters are errors, so a typo is never silently ignored.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from typing import Any

from smdebug.config import (
    SAVE_CONFIG_KEYS,
    CollectionSettings,
    HookConfig,
    ReductionConfig,
    SaveConfig,
    SaveConfigMode,
    to_bool,
    to_int,
    to_regex_list,
    to_steps,
    to_str_list,
)
from smdebug.exceptions import ConfigError, ConfigFileNotFoundError
from smdebug.modes import ModeKeys

logger = logging.getLogger("smdebug")

DEFAULT_CONFIG_PATH = "/opt/ml/input/config/debughookconfig.json"
CONFIG_FILE_PATH_ENV = "SMDEBUG_CONFIG_FILE_PATH"
# SageMaker writes TensorBoard's output config to a file of its own (smdebug reads it on SageMaker).
TENSORBOARD_CONFIG_FILE_PATH_ENV = "TENSORBOARD_CONFIG_FILE_PATH"
DEFAULT_TENSORBOARD_CONFIG_PATH = "/opt/ml/input/config/tensorboardoutputconfig.json"
# Where SageMaker expects tensors and TensorBoard files when the config gives no LocalPath.
DEFAULT_SAGEMAKER_OUT_DIR = "/opt/ml/output/tensors"
DEFAULT_SAGEMAKER_TENSORBOARD_DIR = "/opt/ml/output/tensorboard"

TOP_LEVEL_KEYS = (
    "LocalPath",
    "S3OutputPath",
    "HookParameters",
    "CollectionConfigurations",
    "TensorBoardOutputConfig",
)
MODE_PREFIXES = tuple(f"{m.name.lower()}." for m in ModeKeys)
_REDUCTION_KEYS = ("reductions", "save_raw_tensor", "save_shape")
HOOK_KEYS = (
    "dry_run",
    "save_all",
    "include_workers",
    "include_regex",
    "include_collections",  # comma-separated names, as smdebug 1.0 takes them
    *_REDUCTION_KEYS,
    *SAVE_CONFIG_KEYS,
    "export_tensorboard",  # smdebug reads these two off SageMaker
    "tensorboard_dir",
    "health",  # ours: the always-on flight recorder (smdebug.health)
    "health_steps",
    "health_loss_factor",
)
COLLECTION_ENTRY_KEYS = ("CollectionName", "CollectionParameters")
COLLECTION_KEYS = ("include_regex", "save_histogram", *_REDUCTION_KEYS, *SAVE_CONFIG_KEYS)


# -- finding and loading the file -----------------------------------------------------------------------
def find_config_path(json_file_path: str | None = None) -> str | None:
    """The explicit path, else $SMDEBUG_CONFIG_FILE_PATH, else the SageMaker default if it exists."""
    if json_file_path is not None:
        _check_config_file(json_file_path, "json_file_path")
        return json_file_path
    env_path = os.environ.get(CONFIG_FILE_PATH_ENV)
    if env_path:
        _check_config_file(env_path, CONFIG_FILE_PATH_ENV)
        return env_path
    return DEFAULT_CONFIG_PATH if os.path.isfile(DEFAULT_CONFIG_PATH) else None


def _check_config_file(path: str, where: str) -> None:
    if os.path.isdir(path):
        raise ConfigError(f"{where}: {path!r} is a directory, not a hook configuration file")
    if not os.path.isfile(path):
        raise ConfigFileNotFoundError(f"{where}: hook configuration file {path!r} does not exist")


def find_tensorboard_dir() -> str | None:
    """LocalPath of SageMaker's separate TensorBoard config file, None when there is no such file."""
    path = os.environ.get(TENSORBOARD_CONFIG_FILE_PATH_ENV) or DEFAULT_TENSORBOARD_CONFIG_PATH
    if not os.path.isfile(path):
        return None
    data = _read_json(path)
    return _tensorboard_section(data, path) if isinstance(data, dict) else None


def load_hook_config(path: str, save_defaults: dict | None = None) -> HookConfig:
    """The hook configuration of the file at ``path``; ``save_defaults``: the save keys (save_interval,
    ...) of a mode the file configures only in part, as smdebug 1.0's ``default_values`` (XGBoost's)."""
    data = _read_json(path)
    config = parse_hook_config(data, source=path, save_defaults=save_defaults)
    if not (isinstance(data, dict) and data.get("TensorBoardOutputConfig")):
        tb_dir = find_tensorboard_dir()
        if tb_dir is not None:  # as smdebug on SageMaker: the TensorBoard config file decides
            config.export_tensorboard, config.tensorboard_dir = True, tb_dir
    logger.info("smdebug: hook configuration read from %s", path)
    return config


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a hook configuration file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the hook configuration: {exc}") from None


def _tensorboard_section(section: Any, where: str) -> str:
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: invalid value {section!r} (expected an object with LocalPath)")
    path = section.get("LocalPath") or DEFAULT_SAGEMAKER_TENSORBOARD_DIR
    if not isinstance(path, str):
        raise ConfigError(f"{where}.LocalPath: invalid value {path!r} (expected a path)")
    return path


# -- parsing ----------------------------------------------------------------------------------------------
def parse_hook_config(data: dict, source: str = "<dict>", save_defaults: dict | None = None) -> HookConfig:
    """Build a HookConfig from the SageMaker JSON form; errors are prefixed with `source`."""
    try:
        return _parse(data, save_defaults or {})
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _parse(data: Any, save_defaults: dict) -> HookConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid value {data!r} (expected a JSON object)")
    for key in data:
        if key in TOP_LEVEL_KEYS:
            continue
        # a misspelt section ("LocalPth", "localPath"), which ignoring would save elsewhere, or other
        # tensors, silently; a section only a little like one of ours may be SageMaker's own
        lower = {k.lower(): k for k in TOP_LEVEL_KEYS if k not in data}
        close = difflib.get_close_matches(str(key).lower(), lower, n=1, cutoff=0.85)
        if close:
            raise ConfigError(
                f"{key}: unknown key with value {data[key]!r}; did you mean {lower[close[0]]!r}?"
            )
        # tolerated: SageMaker may add sections we do not use
        logger.warning("smdebug: ignoring unknown key %r in the hook configuration", key)

    # As smdebug 1.0: without LocalPath, SageMaker's local folder (which it uploads to S3OutputPath).
    out_dir = data.get("LocalPath")
    if out_dir is None:  # (null: not given, as for every other key)
        out_dir = DEFAULT_SAGEMAKER_OUT_DIR
    if not isinstance(out_dir, str) or not out_dir.strip():
        raise ConfigError(f"LocalPath: invalid value {out_dir!r} (expected a path)")

    hook = _params(data, "HookParameters", "HookParameters")
    _check_keys(hook, HOOK_KEYS, "HookParameters")
    hook_modes = _save_params(hook, "HookParameters")
    given = any(hook_modes.values())
    hook_modes = {m: {**save_defaults, **p} for m, p in hook_modes.items()}
    args: dict[str, Any] = {"out_dir": out_dir}
    if given:  # (else the hook's own default)
        args["save_config"] = SaveConfig({m: SaveConfigMode(**p) for m, p in hook_modes.items()})
    args["reduction_config"] = _reduction_config(hook, "HookParameters")
    for key in ("dry_run", "save_all", "export_tensorboard", "health"):
        if key in hook:
            args[key] = to_bool(hook[key], f"HookParameters.{key}")
    for key in ("health_steps", "health_loss_factor"):
        if key in hook:
            args[key] = hook[key]  # checked by HookConfig, the error naming the field
    if "include_regex" in hook:
        args["include_regex"] = to_regex_list(hook["include_regex"], "HookParameters.include_regex")
    if "include_workers" in hook:
        workers = hook["include_workers"]
        if workers not in ("one", "all"):
            raise ConfigError(
                f"HookParameters.include_workers: invalid value {workers!r} (expected 'one' or 'all')"
            )
        args["include_workers"] = workers
    if "tensorboard_dir" in hook:
        args["tensorboard_dir"] = hook["tensorboard_dir"]
    if data.get("TensorBoardOutputConfig") is not None:
        args["tensorboard_dir"] = _tensorboard_section(
            data["TensorBoardOutputConfig"], "TensorBoardOutputConfig"
        )
        args["export_tensorboard"] = True

    entries = data.get("CollectionConfigurations")
    if entries is not None and not isinstance(entries, list):
        raise ConfigError(
            f"CollectionConfigurations: invalid value {entries!r} "
            '(expected a list of objects such as {"CollectionName": "weights"})'
        )
    # A collection listed twice (SageMaker merges rule and hook configs): as smdebug, the later entry
    # wins for each parameter it gives, and include_regex patterns accumulate.
    given: dict[str, dict] = {}
    regexes: dict[str, list[str]] = {}
    for index, entry in enumerate(entries or []):
        name, params = _entry(entry, index)
        if "include_regex" in params:
            where = f"CollectionConfigurations[{name}].include_regex"
            regexes.setdefault(name, []).extend(to_regex_list(params.pop("include_regex"), where))
        given.setdefault(name, {}).update(params)
    collections = {
        name: _collection(name, params, regexes.get(name), hook_modes) for name, params in given.items()
    }
    if data.get("CollectionConfigurations") is not None:
        # As smdebug: the collections configured are the ones saved (plus each hook's default ones).
        args["include_collections"] = list(collections)
    if "include_collections" in hook:
        named = to_str_list(hook["include_collections"], "HookParameters.include_collections")
        args["include_collections"] = list(dict.fromkeys([*args.get("include_collections", []), *named]))
    args["collections"] = collections
    return HookConfig(**args)


def _params(container: dict, key: str, where: str) -> dict:
    value = container.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: invalid value {value!r} (expected a JSON object)")
    # A null value means "not given".
    return {k: v for k, v in value.items() if v is not None}


def _check_keys(params: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in params:
        base = key.split(".", 1)[1] if key.lower().startswith(MODE_PREFIXES) else None
        if key in allowed or base in SAVE_CONFIG_KEYS:
            continue
        prefix, dot, rest = key.rpartition(".")
        if dot and rest in SAVE_CONFIG_KEYS:  # a misspelt mode ("trian.save_interval")
            close = [
                f"{p}{rest}" for p in difflib.get_close_matches(f"{prefix.lower()}.", MODE_PREFIXES, n=1)
            ]
        else:
            close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"{where}.{key}: unknown key with value {params[key]!r} (expected one of {', '.join(allowed)}, "
            f"or a save key prefixed with {', '.join(MODE_PREFIXES)}){hint}"
        )


def _save_params(params: dict, where: str) -> dict[ModeKeys, dict]:
    """Per mode, the save keys given: the plain ones, overridden by the mode-prefixed ones."""
    base: dict[str, Any] = {}
    per_mode: dict[ModeKeys, dict] = {m: {} for m in ModeKeys}
    for key, value in params.items():
        prefix, _, name = key.rpartition(".")
        if name not in SAVE_CONFIG_KEYS or (prefix and f"{prefix.lower()}." not in MODE_PREFIXES):
            continue
        field = f"{where}.{key}"
        if name == "save_steps":
            parsed = to_steps(value, field)
        else:
            parsed = to_int(value, field, minimum=1 if name == "save_interval" else 0)
        (per_mode[ModeKeys[prefix.upper()]] if prefix else base)[name] = parsed
    return {m: {**base, **p} for m, p in per_mode.items()}


def _reduction_config(params: dict, where: str) -> ReductionConfig | None:
    if not any(k in params for k in _REDUCTION_KEYS):
        return None
    reductions = params.get("reductions")
    save_raw = to_bool(params.get("save_raw_tensor", True), f"{where}.save_raw_tensor")
    if not to_str_list(reductions, f"{where}.reductions"):
        # as in smdebug 1.0, without reductions the raw tensor is what is saved: turning it off would
        # save nothing (save_shape, which only adds, is honoured)
        if not save_raw:
            logger.warning(
                "smdebug: %s.save_raw_tensor=false is ignored without reductions (the tensors would not "
                "be saved at all): raw values are saved",
                where,
            )
        save_raw = True
    elif "save_raw_tensor" not in params:
        save_raw = False
    return ReductionConfig.from_reductions_string(
        reductions,
        save_raw_tensor=save_raw,
        save_shape=to_bool(params.get("save_shape", False), f"{where}.save_shape"),
        field=f"{where}.reductions",
    )


def _entry(entry: Any, index: int) -> tuple[str, dict]:
    """A collection entry's name and parameters, its keys checked (a typo is never silently ignored)."""
    name = entry.get("CollectionName") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not name:
        for key in entry if name is None and isinstance(entry, dict) else ():  # "CollectionNam"?
            close = difflib.get_close_matches(key, COLLECTION_ENTRY_KEYS, n=1)
            if key not in COLLECTION_ENTRY_KEYS and close:
                raise ConfigError(
                    f"CollectionConfigurations[{index}].{key}: unknown key with value {entry[key]!r}; "
                    f"did you mean {close[0]!r}?"
                )
        where = f"CollectionConfigurations[{index}].CollectionName"
        raise ConfigError(f"{where}: invalid value {name!r} (expected a collection name)")
    where = f"CollectionConfigurations[{name}]"
    for key in entry:
        if key not in COLLECTION_ENTRY_KEYS:  # "CollectionParameter": its parameters would be lost
            close = difflib.get_close_matches(key, COLLECTION_ENTRY_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{where}.{key}: unknown key with value {entry[key]!r} (expected "
                f"{' or '.join(COLLECTION_ENTRY_KEYS)}){hint}"
            )
    params = _params(entry, "CollectionParameters", f"{where}.CollectionParameters")
    _check_keys(params, COLLECTION_KEYS, where)
    return name, params


def _collection(name: str, params: dict, regex: list[str] | None, hook_modes: dict) -> CollectionSettings:
    where = f"CollectionConfigurations[{name}]"
    own = _save_params(params, where)
    save_config = None
    if any(own.values()):
        # As smdebug: the hook's parameters of each mode, overridden by the collection's.
        save_config = SaveConfig({m: SaveConfigMode(**{**hook_modes[m], **own[m]}) for m in ModeKeys})
    histogram = params.get("save_histogram")
    return CollectionSettings(
        name,
        include_regex=None if regex is None else list(dict.fromkeys(regex)),
        save_config=save_config,
        reduction_config=_reduction_config(params, where),
        save_histogram=None if histogram is None else to_bool(histogram, f"{where}.save_histogram"),
    )
