"""Randomly damaged run folders (truncations, bit flips, huge numbers, wrong types, deep nesting, special
files) given to create_trial, values() and every CLI command: only clean errors, no hang, bounded memory.
A fixed seed keeps it reproducible and a few seconds long."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import threading
import tracemalloc

import numpy as np
import pytest

import smdebug
from smdebug.cli import main
from smdebug.exceptions import SMDebugError
from smdebug.hook import BaseHook
from smdebug.trials import create_trial

CASES = 24
TIME_LIMIT = 30.0  # seconds for one damaged run through the API and every command
MEMORY_LIMIT = 64 * 1024 * 1024  # bytes allocated at the peak (the run itself is a few KB)
BAD_VALUES = [1e999, -1, 2**64, 2**40, "x", None, [], {}, True, "9" * 5000]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fuzz") / "run")
    hook = BaseHook(out_dir=out, save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(3):
        hook.begin_step()
        hook.save_tensor("w", np.full((4, 4), step, dtype=np.float32))
        hook.save_scalar("loss", 1.0 / (step + 1))
    hook.close()
    return out


def damage(run: str, rng: random.Random, outside: str) -> str:
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(run) for f in names)
    path = rng.choice(files)
    kind = rng.choice(["truncate", "flip", "number", "deep", "fifo", "device", "outside", "garbage"])
    data = open(path, "rb").read()
    if kind in ("fifo", "device", "outside"):
        os.unlink(path)
        if kind == "fifo":
            os.mkfifo(path)
        else:
            os.symlink("/dev/zero" if kind == "device" else outside, path)
    elif kind == "truncate":
        open(path, "wb").write(data[: rng.randrange(len(data) + 1)])
    elif kind == "flip" and data:
        at = rng.randrange(len(data))
        open(path, "wb").write(data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :])
    elif kind == "number" and path.endswith(".json"):
        text = data.decode()
        numbers = [m for m in range(len(text)) if text[m].isdigit() and not text[m - 1].isalnum()]
        if numbers:
            at = rng.choice(numbers)
            end = at
            while end < len(text) and text[end].isdigit():
                end += 1
            value = rng.choice(BAD_VALUES)
            text = text[:at] + ("1e999" if value == 1e999 else json.dumps(value)) + text[end:]
        open(path, "w").write(text)
    elif kind == "deep":
        open(path, "w").write("[" * rng.choice([2000, 200_000]) + "]" * rng.choice([0, 10]))
    else:
        open(path, "wb").write(rng.randbytes(rng.randrange(1, 200)))
    return f"{kind} {os.path.relpath(path, run)}"


def exercise(run: str, tmp: str) -> list[str]:
    """Everything a user does with a run; what ended otherwise than cleanly."""
    problems = []
    try:
        trial = create_trial(run)
        for name in trial.tensor_names():
            for step in trial.tensor(name).steps():
                try:
                    trial.tensor(name).value(step)
                except SMDebugError:
                    pass
    except SMDebugError:
        pass
    except Exception as exc:  # noqa: BLE001 (the test reports it)
        problems.append(f"API: {type(exc).__name__}: {exc}"[:300])
    commands = [
        ["ls", run],
        ["ls", "--json", run],
        ["show", run, "w"],
        ["show", run, "w", "--step", "1"],
        ["why", run],
        ["diff", run, run],
        ["rules", run, "--rule", "LossNotDecreasing"],
        ["report", run, "-o", os.path.join(tmp, "r.html"), "--no-rules"],
        ["plot", run, "w", "-o", os.path.join(tmp, "p.png")],
        ["export-tensorboard", run, os.path.join(tmp, "tb")],
    ]
    for args in commands:
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                code = main(args)
            if code not in (0, 1, 2):
                problems.append(f"{args[0]}: exit code {code}")
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{args[0]}: {type(exc).__name__}: {exc}"[:300])
    return problems


def test_randomly_damaged_runs_give_only_clean_errors(clean_run, tmp_path):
    rng = random.Random(31)
    outside = tmp_path / "outside.json"
    outside.write_text('{"meta": {"mode": "TRAIN", "mode_step": 0}}')
    failures = []
    for case in range(CASES):
        run = str(tmp_path / f"run{case}")
        shutil.copytree(clean_run, run)
        what = damage(run, rng, str(outside))
        result: list = []
        tracemalloc.start()
        worker = threading.Thread(
            target=lambda out=result, at=run: out.append(exercise(at, str(tmp_path))), daemon=True
        )
        worker.start()
        worker.join(TIME_LIMIT)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if worker.is_alive():
            pytest.fail(f"case {case} ({what}): still running after {TIME_LIMIT:g} s (a hang)")
        if result[0] or peak > MEMORY_LIMIT:
            failures.append(f"case {case} ({what}): {result[0]} peak {peak // 1024} KB")
    assert not failures, "\n".join(failures)
