"""moto's S3 server on 127.0.0.1, reached through the standard AWS settings: shared by the storage and Dask
suites' fixtures (moto is installed in those sessions only)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
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


class StallingProxy:
    """A TCP proxy on 127.0.0.1 in front of a server (moto's) that starts stalling on request: after
    ``stall(matching)`` it takes every request holding ``matching`` (any request: b"") and never answers it
    (a frozen endpoint); after ``trickle(seconds)`` it answers one byte every ``seconds`` (an endpoint too
    slow for a per-read timeout to notice). ``release()`` answers normally again; ``close()`` drops every
    connection."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(128)
        self.port = self._server.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._stalled: bytes | None = None  # what a request holds to go unanswered (None: none)
        self._trickle = 0.0
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self, matching: bytes = b"") -> None:
        self._stalled = matching

    def trickle(self, seconds: float) -> None:
        self._trickle = seconds

    def release(self) -> None:
        self._stalled = None
        self._trickle = 0.0

    def close(self) -> None:
        self._closed = True
        self.release()
        for s in [self._server, *self._sockets]:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client = self._server.accept()[0]
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                return
            self._sockets += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._answers, args=(upstream, client), daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                stalled = self._stalled
                if stalled is None or stalled not in data:  # else the server never sees it: no answer
                    dst.sendall(data)

    def _answers(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if self._trickle:
                    for i in range(len(data)):
                        time.sleep(self._trickle)
                        dst.sendall(data[i : i + 1])
                else:
                    dst.sendall(data)
