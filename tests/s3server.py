"""moto's S3 server on 127.0.0.1, reached through the standard AWS settings: shared by the storage and Dask
suites' fixtures (moto is installed in those sessions only)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"moto's server did not listen on port {port}")


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
            wait_for_port(self.port)

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False


@contextlib.contextmanager
def serving(bucket: str, access_key: str, secret_key: str) -> Iterator[S3Server]:
    """A running server holding ``bucket``, with the AWS settings of this process (and of the subprocesses
    it starts: botocore, under s3fs, reads them) pointing at it; the settings are restored after."""
    saved = dict(os.environ)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = S3Server()
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": server.endpoint,
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key,
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

        boto3.client("s3").create_bucket(Bucket=bucket)
        yield server
    finally:
        server.stop()
        os.environ.clear()
        os.environ.update(saved)
