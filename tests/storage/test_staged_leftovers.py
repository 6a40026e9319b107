"""Files a remote run's steps wait in on local disk (spilled during an S3 outage): only in the system temp
dir, one folder per process; a process killed during the outage leaves its folder, which the next process
staging a remote run removes, saying which run's steps it held. Each spilled file used to be a loose
``smdebug-staged-*`` file in the temp dir that nothing ever removed."""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid

import numpy as np
from conftest import start_training

import smdebug
from smdebug import staging
from smdebug.hook import BaseHook
from smdebug.trials import create_trial


def staged_files(tmp: str) -> list[str]:
    return [
        os.path.join(d, f) for d, _, files in os.walk(tmp) for f in files if f not in ("owner.lock", "run")
    ]


def run_through_an_outage(s3_server, out_dir: str, tmp: str, cwd: str, kill: bool):
    """Train in a subprocess (TMPDIR=tmp) while the server is stopped until steps wait on local disk;
    then kill it, or bring the server back and let it finish."""
    proc = start_training(
        out_dir, 100000 if kill else 60, "--sleep", "0.01", env={**os.environ, "TMPDIR": tmp}, cwd=cwd
    )
    try:
        for line in proc.stdout:
            if line.startswith("step 3 "):
                s3_server.stop()
                break
        deadline = time.monotonic() + 60
        while len(staged_files(tmp)) < 5:
            assert time.monotonic() < deadline and proc.poll() is None, "no step waited on local disk"
            time.sleep(0.1)
        if kill:
            proc.kill()
        else:
            s3_server.start()
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        s3_server.start()


def test_files_left_by_a_process_killed_during_an_outage_are_removed_by_the_next(
    s3_server, s3_uri, tmp_path, monkeypatch, caplog
):
    tmp, cwd = str(tmp_path / "tmp"), str(tmp_path / "cwd")
    os.makedirs(tmp)
    os.makedirs(cwd)
    run_through_an_outage(s3_server, s3_uri, tmp, cwd, kill=True)
    left = staged_files(tmp)
    assert len(left) >= 5 and os.listdir(cwd) == []
    folders = os.listdir(tmp)
    assert len(folders) == 1 and folders[0].startswith("smdebug-staged-"), (
        folders
    )  # one folder, not loose files

    # the next process on this machine that stages a remote run's file
    monkeypatch.setattr(tempfile, "tempdir", tmp)
    caplog.set_level(logging.WARNING, logger="smdebug")
    other = s3_uri.rsplit("/", 1)[0] + f"/other-{uuid.uuid4().hex[:6]}"
    hook = BaseHook(out_dir=other, save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(2):
        hook.begin_step()
        hook.save_tensor("w", np.full((4,), step, dtype=np.float32))
    hook.close()
    assert create_trial(other).steps() == [0, 1]
    assert os.listdir(tmp) == []
    said = [r.getMessage() for r in caplog.records if "left in" in r.getMessage()]
    assert len(said) == 1 and s3_uri in said[0] and "they are not in the run" in said[0], said
    assert f"removed {len(left)} file(s)" in said[0], said


def test_a_process_that_ends_leaves_nothing_in_the_temp_dir(s3_server, s3_uri, tmp_path):
    tmp, cwd = str(tmp_path / "tmp"), str(tmp_path / "cwd")
    os.makedirs(tmp)
    os.makedirs(cwd)
    run_through_an_outage(s3_server, s3_uri, tmp, cwd, kill=False)
    assert os.listdir(tmp) == [] and os.listdir(cwd) == []
    assert create_trial(s3_uri).steps() == list(range(60))


def test_a_live_process_folder_is_left_alone(tmp_path, monkeypatch):
    """A sweep removes only folders whose process is gone: this process's folder is locked."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(staging, "_folder", None)
    monkeypatch.setattr(staging, "_runs", {})
    fd, path = staging.spill_file("s3://bucket/run", "events/000000000007/000000000007_worker_0.tfevents")
    os.close(fd)
    monkeypatch.setattr(staging, "_folder", None)  # as another process would see it
    monkeypatch.setattr(staging, "_swept", set())
    staging.sweep()
    assert os.path.exists(path)


def test_loose_staged_files_of_older_versions_go_when_their_process_surely_has(tmp_path, monkeypatch, caplog):
    """Older versions spilled to loose smdebug-staged-* files (no process named in them): one goes when no
    process holds it open and no Python process that started before it was written is alive."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(staging, "_swept", set())
    caplog.set_level(logging.WARNING, logger="smdebug")
    with open("/proc/stat", encoding="ascii") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))

    def loose(name: str, written: float) -> str:
        path = str(tmp_path / f"smdebug-staged-{name}")
        with open(path, "wb") as f:
            f.write(b"x" * 100)
        os.utime(path, (written, written))
        return path

    gone = loose("gone", boot - 60)  # written before any living process started: its writer is gone
    held = loose("held", boot - 60)  # ... but a living process has it open
    fresh = loose("fresh", time.time())  # this Python process started before it: maybe its writer
    with open(held, "rb"):
        staging.sweep()
    assert not os.path.exists(gone) and os.path.exists(held) and os.path.exists(fresh)
    said = [r.getMessage() for r in caplog.records if "an older smdebug left" in r.getMessage()]
    assert len(said) == 1 and "removed 1 file(s) (100 bytes)" in said[0], said
    assert "their steps are not in their runs" in said[0]
