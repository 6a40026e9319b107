"""Fixtures of the Dask suite: a sweep of 20 small real runs (defects planted in some) plus one damaged
run, the same runs on moto's S3 server, and a LocalCluster of 2 worker processes."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import sweep_runs  # noqa: E402

N_RUNS = 20
STEPS = 24
BUCKET = "smdebug-dask-tests"


@pytest.fixture(scope="session")
def sweep(tmp_path_factory) -> dict:
    """root: a folder holding the 20 runs and a damaged one; defects: run path -> planted defect."""
    root = tmp_path_factory.mktemp("sweep")
    defects = sweep_runs.make_sweep(str(root), n=N_RUNS, steps=STEPS)
    # a twin of run-00 (same seed, same training), to compare runs with
    sweep_runs.make_run(str(root / "run-20"), None, steps=STEPS, seed=0)
    defects[str(root / "run-20")] = None
    # a damaged run: a copy of run-01 whose first index file is cut short
    damaged = root / "run-21"
    shutil.copytree(root / "run-01", damaged)
    index = sorted((damaged / "index").rglob("*.json"))[0]
    index.write_bytes(index.read_bytes()[:20])
    return {"root": str(root), "defects": defects, "damaged": str(damaged)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """moto's S3 server in a thread on 127.0.0.1, reached through the standard AWS settings (which the
    Dask workers, started after it, inherit)."""
    from moto.server import ThreadedMotoServer

    saved = dict(os.environ)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "AKIASMDEBUGDASKKEY01",
            "AWS_SECRET_ACCESS_KEY": "smdebug-dask-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": "2",
        }
    )
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ.pop(name, None)
    server.start()
    _wait_for_port(port)
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def s3_sweep(s3_server, sweep) -> str:
    """The sweep's runs uploaded to s3://BUCKET/sweep (the damaged one too)."""
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.put(sweep["root"], f"{BUCKET}/sweep", recursive=True)
    s3fs.S3FileSystem.clear_instance_cache()
    return f"s3://{BUCKET}/sweep"


@pytest.fixture(scope="session")
def client(s3_server):
    """A LocalCluster of 2 single-threaded worker processes (after the S3 settings: they inherit them)."""
    from smdebug.rules.sweep import local_client

    client, _ = local_client(2)
    try:
        yield client
    finally:
        cluster = client.cluster
        client.close()
        cluster.close()
