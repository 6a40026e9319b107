"""smdebug rules over many runs: a sweep folder on a LocalCluster, an existing cluster by its address,
JSON, exit codes, a live run followed to its end, and Dask missing (serial, with a one-line hint)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import N_RUNS

HERE = Path(__file__).parent


def smdebug(*args, timeout=300, pre=""):
    code = f"{pre}import sys; from smdebug.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "rules", *args], capture_output=True, text=True, timeout=timeout
    )


def start_live_run(out, defect: str, steps: int, pause: float) -> subprocess.Popen:
    """sweep_runs.py training a run slowly in a subprocess (tests/ on its path, for numpy_training)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(HERE / "sweep_runs.py"), str(out), defect, str(steps), str(pause)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.fixture
def dask_port_taken():
    """Port 8787 (where a Dask scheduler serves HTTP by default) held, as by another cluster running."""
    with socket.socket() as sock:
        try:
            sock.bind(("", 8787))
            sock.listen()
        except OSError:
            pass  # already taken
        yield


def test_a_sweep_folder_on_two_workers(sweep, dask_port_taken):
    done = smdebug(
        sweep["root"], "--workers", "2", "--rule", "vanishing_gradient", "--rule", "exploding_tensor"
    )
    assert done.returncode == 1, done.stderr  # rules fired
    # neither Dask's warning that another cluster holds its port nor one of ours (on a loaded machine Dask
    # may still log a late heartbeat, which says nothing about us)
    assert "already in use" not in done.stderr and "smdebug" not in done.stderr, done.stderr
    assert f"Rules on {N_RUNS + 2} runs in {sweep['root']}" in done.stdout
    assert "FIRED" in done.stdout and "malformed" in done.stdout  # the damaged run's row (its cell folds)
    vanishing = [r for r, d in sweep["defects"].items() if d == "vanishing"]
    for run in vanishing:  # named relative to the sweep folder
        assert run.rsplit("/", 1)[1] in done.stdout


def test_json_on_an_existing_cluster(sweep, client):
    address = client.scheduler.address
    done = smdebug(
        sweep["root"] + "/run-0[0-5]", "--scheduler", address, "--json", "--rule", "loss_not_decreasing"
    )
    assert done.returncode == 1, done.stderr
    rows = json.loads(done.stdout)["results"]
    assert len(rows) == 6 and {r["rule"] for r in rows} == {"loss_not_decreasing"}
    flat = [r for r, d in sweep["defects"].items() if d == "flat" and r in {x["run"] for x in rows}]
    assert flat and all(next(x for x in rows if x["run"] == f)["status"] == "fired" for f in flat)


@pytest.mark.parametrize(
    "args, message",
    [
        (("--workers", "0"), "argument --workers: must be at least 1, got 0"),
        (("--workers", "-2"), "argument --workers: must be at least 1, got -2"),
        (("--steps-per-task", "-3"), "argument --steps-per-task: must be at least 1, got -3"),
        (
            ("--start-step", "5", "--end-step", "2"),
            "--end-step 2 leaves no step to evaluate (--start-step 5)",
        ),
        (("--baseline", "{root}/nope"), "baseline {root}/nope: no such file or directory"),
        (("--baseline", "{root}"), "baseline {root}: no smdebug run found"),
    ],
)
def test_bad_options_are_one_line_exit_2(sweep, args, message):
    done = smdebug(sweep["root"], *(a.format(root=sweep["root"]) for a in args))
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.strip().splitlines()[-1].endswith(message.format(root=sweep["root"])), done.stderr
    assert "Traceback" not in done.stderr


def test_healthy_runs_exit_0(sweep):
    healthy = [r for r, d in sweep["defects"].items() if d is None][:3]
    done = smdebug(*healthy, "--workers", "1", "--rule", "exploding_tensor", "--all")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" ok ") == 3


def test_without_dask_serially_with_a_hint(sweep):
    # distributed cannot be imported (as when smdebug-core[dask] is not installed)
    done = smdebug(
        sweep["root"] + "/run-0[0-3]",
        "--rule",
        "vanishing_gradient",
        pre="sys_modules = __import__('sys').modules; sys_modules['distributed'] = None; ",
    )
    assert done.returncode == 1, done.stderr
    hints = [line for line in done.stderr.splitlines() if "Dask is not installed" in line]
    assert len(hints) == 1 and "smdebug-core[dask]" in hints[0]
    assert "Rules on 4 runs" in done.stdout


def test_a_run_still_being_written_is_followed(sweep, tmp_path):
    live = tmp_path / "live"
    writer = start_live_run(live, "flat", 30, 0.2)
    try:
        deadline = time.monotonic() + 60
        while not (live / "index").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        finished = sweep["root"] + "/run-00"
        done = smdebug(finished, str(live), "--workers", "2", "--json", "--rule", "loss_not_decreasing")
        assert writer.wait(60) == 0
    finally:
        writer.kill()
    assert done.returncode == 1, done.stderr
    rows = {r["run"]: r for r in json.loads(done.stdout)["results"]}
    # every step of the live run was evaluated: the rule fired at steps 10 and 20, after the command began
    assert rows[str(live)]["fired_steps"] == [10, 20] and rows[str(live)]["note"] == ""
    assert rows[finished]["status"] == "ok"


def test_watch_stops_a_live_run_when_a_rule_fires(sweep, tmp_path):
    from smdebug.rules.actions import STOP_SIGNAL_FILE
    from smdebug.trials import create_trial

    live = tmp_path / "exploding"
    writer = start_live_run(live, "exploding", 600, 0.1)  # a minute: the cluster starts well before
    try:
        deadline = time.monotonic() + 60
        while not (live / "index").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        finished = sweep["root"] + "/run-00"
        done = smdebug(finished, str(live), "--watch", "--workers", "2", "--rule", "exploding_tensor")
        writer.wait(90)
    finally:
        writer.kill()
    assert done.returncode == 1, done.stdout + done.stderr
    assert (live / STOP_SIGNAL_FILE).exists(), done.stdout
    assert len(create_trial(str(live)).steps()) < 600  # the hook stopped training


def test_evaluate_runs_without_dask_runs_serially_with_one_warning(sweep):
    code = (
        "import sys; sys.modules['distributed'] = None\n"
        "from smdebug.rules.sweep import evaluate_runs\n"
        f"df = evaluate_runs({sweep['root'] + '/run-0[0-3]'!r}, ['vanishing_gradient'], workers=2)\n"
        "print(len(df), (df.status == 'fired').sum())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["4", "1"]  # run-01 has vanishing gradients
    warnings = [line for line in done.stderr.splitlines() if "Dask is not installed" in line]
    assert len(warnings) == 1 and "smdebug-core[dask]" in warnings[0]
