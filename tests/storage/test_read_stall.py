"""A reader against an S3 endpoint that stops answering in the middle of a read (it takes the request and
never answers), or answers a byte at a time: create_trial, value() and `smdebug ls` give one clear error
naming the store and SMDEBUG_READ_TIMEOUT in bounded time. They waited for the storage client's read
timeout times its retries times smdebug's own (minutes), or, for a trickle, for as long as it went on."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from s3server import StallingProxy

import smdebug
from smdebug.hook import BaseHook
from smdebug.trials import create_trial

TIMEOUT = 5  # SMDEBUG_READ_TIMEOUT in these tests
BOUND = 45  # seconds: generous for a loaded machine; the reads waited minutes


@pytest.fixture
def run(s3_uri):
    hook = BaseHook(out_dir=s3_uri, save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(3):
        hook.begin_step()
        hook.save_tensor("w", np.full((4,), step, dtype=np.float32))
    hook.close()
    return s3_uri


@pytest.fixture
def proxy(s3_server, monkeypatch):
    """moto's server reached through a proxy that stalls on request."""
    import s3fs

    stalling = StallingProxy(s3_server.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", stalling.endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    yield stalling
    stalling.close()
    s3fs.S3FileSystem.clear_instance_cache()


def timed(call):
    began = time.monotonic()
    with pytest.raises(OSError) as info:
        call()
    return time.monotonic() - began, str(info.value)


def test_a_value_read_from_an_endpoint_that_stops_answering_is_one_clear_error(run, proxy, monkeypatch):
    trial = create_trial(run)
    assert trial.steps() == [0, 1, 2]
    monkeypatch.setenv("SMDEBUG_READ_TIMEOUT", str(TIMEOUT))
    proxy.stall()
    took, error = timed(lambda: trial.tensor("w").value(2))
    assert took < BOUND, took
    assert "did not answer within" in error and "SMDEBUG_READ_TIMEOUT" in error and "\n" not in error, error
    took, error = timed(lambda: trial.tensor("w").values())
    assert took < BOUND and "did not answer within" in error, (took, error)
    proxy.release()
    assert trial.tensor("w").value(2).tolist() == [2.0] * 4  # no damage: the same read works again
    assert trial.corrupt_steps() == []


def test_a_value_read_answered_a_byte_at_a_time_is_given_up(run, proxy, monkeypatch):
    trial = create_trial(run)
    monkeypatch.setenv("SMDEBUG_READ_TIMEOUT", str(TIMEOUT))
    proxy.trickle(0.5)  # every answer's headers alone take minutes; no socket read ever waits 0.5 s
    took, error = timed(lambda: trial.tensor("w").value(1))
    assert took < BOUND, took
    assert "did not answer within" in error, error


def test_create_trial_on_an_endpoint_that_stops_answering_mid_listing(run, proxy, monkeypatch):
    """The endpoint answers the first listing (the trial's reachability check), then hangs when asked
    for the index."""
    monkeypatch.setenv("SMDEBUG_READ_TIMEOUT", str(TIMEOUT))
    proxy.stall(b"index")
    took, error = timed(lambda: create_trial(run))
    assert took < BOUND, took
    assert "did not answer within" in error and "\n" not in error, error


def test_smdebug_ls_on_an_endpoint_that_stops_answering_mid_listing(run, proxy):
    proxy.stall(b"index")
    env = {**os.environ, "SMDEBUG_READ_TIMEOUT": str(TIMEOUT)}
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "smdebug", "ls", run], capture_output=True, text=True, env=env, timeout=300
    )
    took = time.monotonic() - began
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if "smdebug-broken" not in line]
    assert len(lines) == 1 and "did not answer within" in lines[0], result.stderr
    assert took < BOUND + 15, took  # (+ the interpreter's start)


def test_a_sweeps_baseline_on_an_endpoint_that_stops_answering(run, proxy, monkeypatch):
    """The sweep's look at its baseline (is a run there?) is a read like any other: bounded."""
    from smdebug.rules.sweep import evaluate_rows

    monkeypatch.setenv("SMDEBUG_READ_TIMEOUT", str(TIMEOUT))
    baseline = run.rsplit("/", 1)[0] + "/no-run-here"
    proxy.stall(b"no-run-here")
    took, error = timed(lambda: evaluate_rows([run], [("exploding_tensor", {})], baseline=baseline))
    assert took < BOUND, took
    assert "did not answer within" in error and "SMDEBUG_READ_TIMEOUT" in error, error
