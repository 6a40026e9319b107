"""Store details: credentials scrubbed from messages, paths confined to the run."""

from __future__ import annotations

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
