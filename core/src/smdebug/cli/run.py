"""``smdebug run``: run any training command with smdebug activated on framework import.

    smdebug run [--out-dir DIR] [--config FILE] [--collections NAME ...] [--save-interval N] -- COMMAND
    smdebug run --out-dir run --collections weights losses -- python train.py --epochs 2

The command runs unchanged; a hook configuration (``--config``, completed by the other options) is handed
to it through ``SMDEBUG_CONFIG_FILE_PATH``, so the plugin of each framework the script imports builds its
hook from it (see ``smdebug.activation``). At the end the command prints where the run was saved and exits
with the command's exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from smdebug.exceptions import SMDebugValueError
from smdebug.open_runs import RUN_REPORT_ENV

USAGE = (
    "smdebug run [--out-dir DIR] [--config FILE] [--collections NAME ...] [--save-interval N] "
    "[--health] [--health-steps N] -- COMMAND ..."
)


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        usage=USAGE,
        help="run a training command with smdebug on, without changing the script",
        description=(
            "Run COMMAND with smdebug activated: each framework an installed plugin serves gets a hook "
            "built from the configuration the moment the script imports it. 'python' as the first word of "
            "COMMAND (or a bare script.py) runs with the interpreter smdebug is installed in."
        ),
    )
    parser.add_argument(
        "--out-dir", metavar="DIR", help="where to save the run (default: a new folder under ./smdebug-runs)"
    )
    parser.add_argument(
        "--config", metavar="FILE", help="a hook configuration in SageMaker's JSON form to start from"
    )
    parser.add_argument(
        "--collections",
        nargs="+",
        metavar="NAME",
        help="collections to save, e.g. weights gradients losses (commas work too)",
    )
    parser.add_argument("--save-interval", type=int, metavar="N", help="save every N steps")
    parser.add_argument(
        "--health",
        action="store_true",
        help="watch every step's weights, gradients and loss (flight recorder, first non-finite value)",
    )
    parser.add_argument(
        "--health-steps",
        type=int,
        metavar="N",
        help="with --health (implied): the recorder keeps N steps (100)",
    )
    # dest is not "command": that is where the top-level parser keeps the subcommand's name
    parser.add_argument(
        "command_args", metavar="COMMAND", nargs=argparse.REMAINDER, help="the command to run, after --"
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    command = list(args.command_args)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise SMDebugValueError("give the command to run after --, e.g. smdebug run -- python train.py")
    command = _interpreter(command)
    data = _config(args)
    out_dir = data["LocalPath"]
    _check_new_run(out_dir)

    workdir = tempfile.mkdtemp(prefix="smdebug-run-")
    try:
        config_path = os.path.join(workdir, "debughookconfig.json")
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        env = dict(os.environ)
        env["SMDEBUG_CONFIG_FILE_PATH"] = config_path
        report = os.path.join(workdir, "hooks.jsonl")
        env[RUN_REPORT_ENV] = report
        for name in ("SMDEBUG_DISABLE", "USE_SMDEBUG"):  # asking for smdebug run overrides them
            env.pop(name, None)
        print(f"smdebug run: saving to {out_dir}", file=sys.stderr, flush=True)
        code = _run_child(command, env)
        written = _written(report)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    elsewhere = [d for d in written if d != out_dir]
    if _has_run(out_dir):
        print(f"smdebug run: run saved to {out_dir}", flush=True)
        if not (args.config or args.collections or args.save_interval or args.health or args.health_steps):
            print(
                "smdebug run: the defaults save the losses every 500 steps; to save more: "
                "--collections weights gradients losses --save-interval 10",
                file=sys.stderr,
            )
    if elsewhere:
        print(
            f"smdebug run: the script's own hook saved to {', '.join(elsewhere)} (a hook the script makes "
            f"keeps its out_dir){'' if _has_run(out_dir) else f'; nothing went to {out_dir}'}",
            flush=True,
        )
    elif not _has_run(out_dir):
        from smdebug import plugins

        served = ", ".join(sorted(n for fw in plugins.frameworks().values() for n in fw.import_names))
        print(
            f"smdebug run: nothing was saved to {out_dir}: the command imported no framework an installed "
            f"plugin serves ({served or 'no plugin installed'}), or ran no step",
            file=sys.stderr,
        )
    return code


def _written(report: str) -> list[str]:
    """Where the command's hooks wrote, in order (each hook notes its out_dir when it starts writing)."""
    try:
        with open(report, encoding="utf-8") as f:
            found = [json.loads(line)["out_dir"] for line in f if line.strip()]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    seen = []
    for path in found:
        path = path if "://" in path else os.path.abspath(path)
        if path not in seen:
            seen.append(path)
    return seen


def _interpreter(command: list[str]) -> list[str]:
    """'python' means the interpreter smdebug is installed in (a PATH lookup could find another one)."""
    if command[0] in ("python", "python3"):
        return [sys.executable, *command[1:]]
    if command[0].endswith(".py") and os.path.isfile(command[0]):
        return [sys.executable, *command]
    return command


def _config(args) -> dict:
    """The configuration to hand to the command: --config's, completed by the options."""
    from smdebug.json_config import _read_json, parse_hook_config

    data: dict = {}
    if args.config:
        data = _read_json(args.config)
        if not isinstance(data, dict):
            raise SMDebugValueError(f"{args.config}: expected a JSON object")
        parse_hook_config(data, source=args.config)  # as written (a misspelt LocalPath is not filled in)
    if args.out_dir:
        data["LocalPath"] = args.out_dir
    if not data.get("LocalPath"):
        data["LocalPath"] = os.path.join("smdebug-runs", time.strftime("run-%Y%m%d-%H%M%S"))
    if "://" not in data["LocalPath"]:  # the command may change its working directory
        data["LocalPath"] = os.path.abspath(data["LocalPath"])
    if args.save_interval is not None:
        if args.save_interval < 1:
            raise SMDebugValueError(f"--save-interval: expected a positive number, got {args.save_interval}")
        hook = data.setdefault("HookParameters", {})
        for key in [k for k in hook if k.lower().endswith(".save_interval")]:  # it is every mode's
            del hook[key]
        hook["save_interval"] = str(args.save_interval)
    if args.health_steps is not None:
        if args.health_steps < 1:
            raise SMDebugValueError(f"--health-steps: expected a positive number, got {args.health_steps}")
        data.setdefault("HookParameters", {})["health_steps"] = str(args.health_steps)
    if args.health or args.health_steps is not None:
        data.setdefault("HookParameters", {})["health"] = "true"
    if args.collections:
        entries = data.setdefault("CollectionConfigurations", [])
        if not isinstance(entries, list):  # reported by the parser, with the configuration's path
            parse_hook_config(data, source=args.config or "smdebug run")
        present = {e.get("CollectionName") for e in entries if isinstance(e, dict)}
        for name in (n.strip() for arg in args.collections for n in arg.split(",")):
            if name and name not in present:
                entries.append({"CollectionName": name})
                present.add(name)
    parse_hook_config(data, source=args.config or "smdebug run")  # a bad configuration stops here
    return data


def _check_new_run(out_dir: str) -> None:
    from smdebug import plugins
    from smdebug.layout import END_OF_JOB_FILE

    if plugins.open_store(out_dir).exists(END_OF_JOB_FILE):
        raise SMDebugValueError(
            f"--out-dir: {out_dir} already holds a finished smdebug run; choose a new one"
        )


def _has_run(out_dir: str) -> bool:
    from smdebug import plugins
    from smdebug.layout import END_OF_JOB_FILE

    try:
        store = plugins.open_store(out_dir)
        return store.exists(END_OF_JOB_FILE) or bool(store.list_dirs(""))
    except Exception:
        return False


def _run_child(command: list[str], env: dict) -> int:
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise SMDebugValueError(f"cannot run {command[0]!r}: {exc.strerror or exc}") from None
    while True:
        try:
            code = child.wait()
            break
        except KeyboardInterrupt:  # Ctrl-C reached the command too: wait for it to save and stop
            continue
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as shells report it
