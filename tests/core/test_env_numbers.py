"""A mistyped number in one of smdebug's environment variables (sizes, timeouts) is one warning naming the
variable, and the default is used: before, a run saved nothing (every step failed on the value), the hook
was dropped on activation, or `smdebug` lost all its subcommands."""

import os
import subprocess
import sys
import textwrap

import pytest
from test_first_hour import write_run

from smdebug.env import env_number
from smdebug.trials import create_trial

BAD = {
    "SMDEBUG_MAX_QUEUE_BYTES": "1GB",
    "SMDEBUG_CLOSE_TIMEOUT": "abc",
    "SMDEBUG_CHECK_TIMEOUT": "5s",
    "SMDEBUG_READ_CACHE_BYTES": "lots",
    "SMDEBUG_CLI_REACH_TIMEOUT": "-3",
}


@pytest.mark.parametrize(
    ("raw", "kwargs", "expected"),
    [
        ("", {}, 7),
        ("2.5", {}, 2.5),
        ("0", {}, 0.0),
        ("1e9", {"integer": True}, 1_000_000_000),
        ("1.5", {"integer": True}, 7),
        ("0", {"positive": True}, 7),
        ("-1", {}, 7),
        ("nan", {}, 7),
        ("inf", {}, 7),
        ("ten", {}, 7),
    ],
)
def test_env_number(monkeypatch, caplog_smdebug, raw, kwargs, expected):
    monkeypatch.setenv("SMDEBUG_TEST_NUMBER", raw)
    assert env_number("SMDEBUG_TEST_NUMBER", 7, **kwargs) == expected
    warned = [r.getMessage() for r in caplog_smdebug.records if "SMDEBUG_TEST_NUMBER" in r.getMessage()]
    if expected == 7 and raw:
        assert warned == [
            f"smdebug: SMDEBUG_TEST_NUMBER={raw!r} is not a " + warned[0].split(" is not a ")[1]
        ]
        assert warned[0].endswith("; using the default, 7")
    else:
        assert not warned


def test_a_run_saves_every_step_with_bad_numbers_in_the_environment(tmp_path):
    out = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_first_hour import write_run
        write_run({str(out)!r}, steps=30)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, **BAD}, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert create_trial(str(out)).steps() == list(range(30))
    for name in ("SMDEBUG_MAX_QUEUE_BYTES", "SMDEBUG_CLOSE_TIMEOUT", "SMDEBUG_CHECK_TIMEOUT"):
        lines = [line for line in done.stderr.splitlines() if name in line]
        assert lines and all(f"{name}={BAD[name]!r} is not a" in line for line in lines), done.stderr
    assert "could not" not in done.stderr


@pytest.mark.parametrize("command", [["ls"], ["show", "loss"]])
def test_the_cli_reads_a_run_with_bad_numbers_in_the_environment(tmp_path, command):
    run = write_run(str(tmp_path / "run"))
    exe = os.path.join(os.path.dirname(sys.executable), "smdebug")
    cmd = [exe, command[0], run, *command[1:]]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **BAD}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "4 saved steps" in done.stdout or "Steps: 0, 1, 2, 3" in done.stdout, done.stdout
    assert "SMDEBUG_CLI_REACH_TIMEOUT='-3' is not a positive number" in done.stderr
    if command[0] == "show":
        assert "SMDEBUG_READ_CACHE_BYTES='lots' is not a non-negative integer" in done.stderr
