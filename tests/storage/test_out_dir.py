"""Output location: a directory holding a run is refused; no tensor name writes outside out_dir."""

from __future__ import annotations

import os

import numpy as np
import pytest

import smdebug
from smdebug.exceptions import ConfigError
from smdebug.hook import BaseHook
from smdebug.trials import create_trial


def save_steps(out_dir, steps=2, close=True):
    hook = BaseHook(out_dir=out_dir, save_config=smdebug.SaveConfig(save_interval=1))
    for _ in range(steps):
        hook.begin_step()
        hook.save_tensor("x", np.arange(3.0))
    if close:
        hook.close()
    else:
        hook._writer.flush()
    return hook


def test_a_finished_run_is_refused(tmp_path):
    out_dir = str(tmp_path / "run")
    save_steps(out_dir)
    with pytest.raises(ConfigError, match=r"out_dir: .*run already holds a finished smdebug run"):
        BaseHook(out_dir=out_dir)
    assert create_trial(out_dir).steps() == [0, 1]  # the earlier run is untouched


def test_a_crashed_run_is_refused_too(tmp_path):
    out_dir = str(tmp_path / "run")
    save_steps(out_dir, close=False)  # no end marker, as after a crash
    with pytest.raises(ConfigError, match="already holds an earlier smdebug run of worker_0"):
        BaseHook(out_dir=out_dir)


def test_a_run_with_only_index_files_is_refused(tmp_path):
    out_dir = tmp_path / "run"
    save_steps(str(out_dir))
    os.remove(out_dir / "training_job_end.ts")
    for path in (out_dir / "collections").rglob("*.json"):
        path.unlink()
    with pytest.raises(ConfigError, match=r"index/000000000/000000000000_worker_0\.json"):
        BaseHook(out_dir=str(out_dir))


def test_the_error_is_also_the_runtime_error_smdebug_raised(tmp_path):
    from smdebug.exceptions import SMDebugRuntimeError

    out_dir = str(tmp_path / "run")
    save_steps(out_dir)
    with pytest.raises(SMDebugRuntimeError):
        BaseHook(out_dir=out_dir)
    with pytest.raises(RuntimeError):
        BaseHook(out_dir=out_dir)


def test_an_empty_or_unrelated_directory_is_fine(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    save_steps(str(tmp_path / "run"))
    assert create_trial(str(tmp_path / "run")).steps() == [0, 1]


def test_workers_of_one_distributed_run_share_the_directory(tmp_path):
    out_dir = str(tmp_path / "run")
    save_steps(out_dir, close=False)  # worker_0 has started writing

    class SecondWorker(BaseHook):
        def worker_name(self):
            return "worker_1"

        def num_workers(self):
            return 2

    # another worker of the same run joins: worker_0's files are not an earlier run of its own
    hook = SecondWorker(
        out_dir=out_dir, include_workers="all", save_config=smdebug.SaveConfig(save_interval=1)
    )
    hook.begin_step()
    hook.save_tensor("x", np.arange(3.0) + 1)
    hook.close()
    trial = create_trial(out_dir)
    assert trial.workers() == ["worker_0", "worker_1"]
    np.testing.assert_array_equal(trial.tensor("x").value(0, worker="worker_1"), np.arange(3.0) + 1)
    with pytest.raises(ConfigError):  # but worker_1 may not start over in it
        SecondWorker(out_dir=out_dir, include_workers="all")


def test_dry_run_is_never_refused(tmp_path):
    out_dir = str(tmp_path / "run")
    save_steps(out_dir)
    before = sorted(str(p.relative_to(out_dir)) for p in (tmp_path / "run").rglob("*"))
    hook = BaseHook(out_dir=out_dir, dry_run=True)  # an existing run: no OutDirExistsError
    hook.begin_step()
    hook.save_for_step("w", np.ones(3, dtype=np.float32))
    hook.end_step()
    hook.close()
    assert not hook.writing
    assert sorted(str(p.relative_to(out_dir)) for p in (tmp_path / "run").rglob("*")) == before


UNSAFE = [
    "../../escaped",
    "../outside/../../x",
    "/etc/passwd_smdebug",
    "/abs/../../up",
    "nul\0inside",
    "x" * 5000,
    "a/" * 300 + "deep",
    "..",
    ".",
    "C:\\windows\\..\\..\\y",
    "~/home",
]


def test_tensor_names_never_write_outside_out_dir(tmp_path):
    base = tmp_path / "sandbox"
    base.mkdir()
    out_dir = base / "run"
    hook = BaseHook(out_dir=str(out_dir), save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(2):
        hook.begin_step()
        for i, name in enumerate(UNSAFE):
            hook.save_tensor(name, np.array([i, step], dtype=np.int64))
    hook.close()
    # nothing outside out_dir, and inside only smdebug's own layout
    assert sorted(p.name for p in base.iterdir()) == ["run"]
    assert not os.path.exists("/etc/passwd_smdebug")
    top = sorted(p.name for p in out_dir.iterdir())
    # the worker's claim (writers/) is dropped once the end-of-job marker protects the run
    assert top == ["collections", "events", "index", "training_job_end.ts"]
    for path in out_dir.rglob("*"):
        assert path.resolve().is_relative_to(out_dir.resolve())
        assert len(path.name) < 100
    trial = create_trial(str(out_dir))
    assert set(UNSAFE) <= set(trial.tensor_names())
    for i, name in enumerate(UNSAFE):
        np.testing.assert_array_equal(trial.tensor(name).value(1), [i, 1])


@pytest.mark.parametrize("out_dir", ["s3://", "s3:///run", "s3:///", "gs:///run"])
def test_an_object_store_uri_without_a_bucket_is_refused(out_dir, tmp_path, monkeypatch):
    """A bucket variable left empty (f"s3://{bucket}/run"): "s3://" used to become a local folder "s3:" in
    the working directory, "s3:///run" lost every step to "bucket does not exist" after training."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^out_dir: .* names no bucket"):
        BaseHook(out_dir=out_dir)
    assert os.listdir(tmp_path) == []


def test_a_uri_no_filesystem_knows_is_refused_at_creation(tmp_path, monkeypatch):
    """ "S3://bucket/run" (fsspec knows s3, not S3): one error naming the URI when the hook is made, not a
    run that trains to the end with every step unsaved."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^out_dir: cannot open S3://bucket/run: .*S3"):
        BaseHook(out_dir="S3://bucket/run")
    assert os.listdir(tmp_path) == []


def test_a_local_folder_that_cannot_be_written_is_refused_at_creation():
    """/sys takes no new folder (EPERM, root included): one error when the hook is made; it trained to
    the end, every step unsaved, and nothing could record that."""
    with pytest.raises(ConfigError, match=r"^out_dir: cannot write to /sys/smdebug-run: .*Errno"):
        BaseHook(out_dir="/sys/smdebug-run")
