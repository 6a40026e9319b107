"""Fixtures of the storage suite: moto's S3 server on 127.0.0.1 (a free port), reached by s3fs through the
standard AWS settings, and a helper that runs real training in a subprocess."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).parent
# Deliberately recognisable: tests assert they never show up in a log or an error message.
ACCESS_KEY = "AKIASMDEBUGTESTKEY01"
SECRET_KEY = "smdebug-test-secret-do-not-print-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's S3 server in a thread of this process; stop() and start() keep its buckets."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.running = False

    def start(self) -> None:
        if not self.running:
            self._server.start()
            self.running = True
            _wait_for_port(self.port)

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False


def _wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"moto's server did not listen on port {port}")


@pytest.fixture(scope="session")
def s3_server():
    saved = dict(os.environ)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = S3Server()
    os.environ.update(
        {
            # the standard AWS settings: botocore (under s3fs) reads them, and subprocesses inherit them
            "AWS_ENDPOINT_URL": server.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_RETRY_MODE": "standard",
            "AWS_MAX_ATTEMPTS": "2",
        }
    )
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ.pop(name, None)
    server.start()
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket="smdebug-tests")
        yield server
    finally:
        server.stop()
        os.environ.clear()
        os.environ.update(saved)


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
    """Start tests/storage/train_run.py (real torch training with the hook) in a subprocess."""
    cmd = [sys.executable, str(HERE / "train_run.py"), out_dir, str(steps), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
