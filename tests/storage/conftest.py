"""Fixtures of the storage suite: moto's S3 server on 127.0.0.1 (a free port), reached by s3fs through the
standard AWS settings, and a helper that runs real (numpy) training in a subprocess."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from s3server import serving  # tests/s3server.py (tests/ is on pytest's pythonpath)

HERE = Path(__file__).parent
# Deliberately recognisable: tests assert they never show up in a log or an error message.
ACCESS_KEY = "AKIASMDEBUGTESTKEY01"
SECRET_KEY = "smdebug-test-secret-do-not-print-0123456789"


@pytest.fixture(scope="session")
def s3_server():
    with serving("smdebug-tests", ACCESS_KEY, SECRET_KEY) as server:
        yield server


@pytest.fixture
def s3_uri(s3_server):
    """A fresh prefix in the test bucket (the server is up again if a test stopped it)."""
    s3_server.start()
    _forget_s3fs()
    yield f"s3://smdebug-tests/{uuid.uuid4().hex[:12]}/run"
    s3_server.start()
    _forget_s3fs()


def _forget_s3fs() -> None:
    """Drop s3fs instances and their listing caches between tests."""
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
    except ImportError:
        pass


@pytest.fixture
def caplog_smdebug(caplog):
    caplog.set_level(logging.DEBUG, logger="smdebug")
    return caplog


def start_training(out_dir: str, steps: int, *args: str, **popen) -> subprocess.Popen:
    """Start tests/storage/train_run.py (real numpy training with the core's hook) in a subprocess."""
    cmd = [sys.executable, str(HERE / "train_run.py"), out_dir, str(steps), *args]
    env = dict(popen.pop("env", os.environ))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen)
