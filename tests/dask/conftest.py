"""Fixtures of the Dask suite: a sweep of 20 small real runs (defects planted in some) plus one damaged
run, the same runs on moto's S3 server, and a LocalCluster of 2 worker processes."""

from __future__ import annotations

import shutil

import pytest
import sweep_runs
from s3server import serving  # tests/s3server.py (tests/ is on pytest's pythonpath)

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
    # a damaged run: a copy of run-01 whose collections file is cut short (a damaged step's index file
    # would only skip that step: this leaves the run nothing to read by)
    damaged = root / "run-21"
    shutil.copytree(root / "run-01", damaged)
    collections = sorted((damaged / "collections").rglob("*.json"))[0]
    collections.write_bytes(collections.read_bytes()[:20])
    return {"root": str(root), "defects": defects, "damaged": str(damaged)}


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server (the Dask workers, started after it, inherit its settings)."""
    with serving(BUCKET, "AKIASMDEBUGDASKKEY01", "smdebug-dask-test-secret") as server:
        yield server


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
