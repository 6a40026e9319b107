"""Store details: credentials scrubbed from messages, paths confined to the run."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from smdebug.store import Store, redact


def test_redact_masks_url_passwords_and_environment_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEXAMPLETOKEN")
    text = (
        "GET http://user:hunter2pass@minio.local/b failed with key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY "
        "and token FwoGZXIvYXdzEXAMPLETOKEN"
    )
    out = redact(text)
    for secret in ("hunter2pass", "wJalrXUtnFEMI", "FwoGZXIvYXdz"):
        assert secret not in out
    assert "minio.local/b" in out


def test_store_describe_masks_its_own_storage_options(tmp_path):
    store = Store(str(tmp_path / "run"))
    store._secrets = ["my-storage-option-secret"]
    message = store.describe(PermissionError("denied for my-storage-option-secret"))
    assert message == "PermissionError: denied for ***"


@pytest.mark.parametrize("bad", ["../x", "/abs", "a/../../b", "a//b", "nul\0", ".", "a/./b"])
def test_store_refuses_paths_leaving_the_run(tmp_path, bad):
    store = Store(str(tmp_path / "run"))
    with pytest.raises(ValueError, match="unsafe path"):
        store.write_bytes(bad, b"x")
    assert not any(tmp_path.rglob("x"))


def test_staged_file_is_invisible_until_committed(tmp_path):
    store = Store(str(tmp_path / "run"))
    staged = store.stage("events/000000000000/000000000000_worker_0.tfevents")
    staged.write(b"abc")
    assert store.list("events") == []  # a reader listing now sees nothing
    staged.commit()
    assert store.list("events") == ["events/000000000000/000000000000_worker_0.tfevents"]
    assert store.read_bytes("events/000000000000/000000000000_worker_0.tfevents") == b"abc"


def test_a_staged_file_holds_its_writes_in_order_small_and_large(tmp_path):
    """Small writes are joined before they reach the file, large ones go as they are: the same bytes."""
    store = Store(str(tmp_path / "run"))
    big = np.arange(40_000, dtype=np.float32)  # beyond the joining buffer
    parts = [b"head", np.float32(1.5), big, b"", np.zeros((0, 3)), big[:3], b"tail"]
    staged = store.stage("events/000000000000/000000000000_worker_0.tfevents")
    for part in parts:
        staged.write(part)
    staged.seal()
    staged.resume()  # written on after sealing (a step written again)
    staged.write(b"more")
    staged.commit()
    expected = b"".join(memoryview(p).tobytes() for p in parts) + b"more"
    assert staged.size == len(expected)
    assert store.read_bytes("events/000000000000/000000000000_worker_0.tfevents") == expected


def test_a_folder_removed_after_it_was_made_is_made_again(tmp_path):
    store = Store(str(tmp_path / "run"))
    store.write_bytes("index/000000000/000000000000_worker_0.json", b"{}")
    shutil.rmtree(tmp_path / "run" / "index")  # (the store remembers the folders it made)
    store.write_bytes("index/000000000/000000000001_worker_0.json", b"{}")
    staged = store.stage("index/000000000/000000000002_worker_0.json")
    staged.write(b"{}")
    staged.commit()
    assert store.list("index") == [f"index/000000000/00000000000{i}_worker_0.json" for i in (1, 2)]
