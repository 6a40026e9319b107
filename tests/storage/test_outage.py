"""S3 outage: the server stops mid-run. Training goes on, writes are retried with backoff, and the waiting
steps land when it comes back; if it never does, close() says exactly which steps were not saved."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
from conftest import ACCESS_KEY, SECRET_KEY

import smdebug
from smdebug.exceptions import CorruptRunError
from smdebug.hook import BaseHook
from smdebug.modes import ModeKeys
from smdebug.store import Store
from smdebug.trials import create_trial
from smdebug.writing import RunWriter


def value(step):
    return np.full((16, 16), step, dtype=np.float32)


def train(hook, steps):
    for step in steps:
        hook.begin_step()
        hook.save_tensor("w", value(step))
        hook.save_scalar("loss", float(step))
    hook.end_step()


def no_credentials_in(caplog, *texts):
    everything = caplog.text + "".join(texts)
    assert SECRET_KEY not in everything
    assert ACCESS_KEY not in everything


def test_steps_written_during_an_outage_land_when_the_server_returns(s3_server, s3_uri, caplog):
    caplog.set_level(logging.DEBUG, logger="smdebug")
    hook = BaseHook(out_dir=s3_uri, save_config=smdebug.SaveConfig(save_interval=1))
    train(hook, range(0, 4))
    hook._writer.flush()
    s3_server.stop()
    train(hook, range(4, 12))  # training goes on while nothing can be written
    hook._writer.flush()
    assert hook._writer.pending_steps == list(range(4, 12))
    assert any("retrying in the background" in r.getMessage() for r in caplog.records)
    s3_server.start()
    hook.close()
    assert hook._writer.failed_steps == {}
    trial = create_trial(s3_uri)
    assert trial.steps() == list(range(12))
    assert trial.training_ended()
    for step in range(12):
        np.testing.assert_array_equal(trial.tensor("w").value(step), value(step))
        assert trial.tensor("scalar/loss").value(step) == step
    assert any("reachable again" in r.getMessage() for r in caplog.records)
    no_credentials_in(caplog)


def test_close_names_the_steps_that_were_never_saved(s3_server, s3_uri, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="smdebug")
    monkeypatch.setenv("SMDEBUG_CLOSE_TIMEOUT", "1.5")
    hook = BaseHook(out_dir=s3_uri, save_config=smdebug.SaveConfig(save_interval=1))
    train(hook, range(0, 3))
    hook._writer.flush()
    s3_server.stop()
    train(hook, range(3, 7))
    hook.close()  # never raises: the server does not come back
    report = [r.getMessage() for r in caplog.records if "could not be saved" in r.getMessage()]
    assert len(report) == 1
    assert "4 step(s) could not be saved: 3, 4, 5, 6 (" in report[0]
    assert "training_job_end.ts" in report[0]
    assert sorted(hook._writer.failed_steps) == [3, 4, 5, 6]
    no_credentials_in(caplog, *hook._writer.failed_steps.values())
    s3_server.start()
    # a request close() gave up on may still complete now; the step it sends is taken out again
    hook._writer._publisher.join(timeout=60)
    trial = create_trial(s3_uri)  # what was saved before the outage is intact, and no more
    assert trial.steps() == [0, 1, 2]
    assert not trial.training_ended()
    np.testing.assert_array_equal(trial.tensor("w").value(2), value(2))


def test_a_bucket_that_appears_late_still_gets_every_step(s3_server, caplog):
    import uuid

    import boto3

    bucket = f"smdebug-late-{uuid.uuid4().hex[:8]}"
    uri = f"s3://{bucket}/run"
    hook = BaseHook(out_dir=uri, save_config=smdebug.SaveConfig(save_interval=1))
    train(hook, range(0, 3))
    hook._writer.flush()
    assert hook._writer.pending_steps == [0, 1, 2]  # no such bucket yet: waiting, not lost
    boto3.client("s3").create_bucket(Bucket=bucket)
    train(hook, range(3, 5))
    hook.close()
    trial = create_trial(uri)
    assert trial.steps() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(trial.tensor("w").value(0), value(0))
    no_credentials_in(caplog)


def test_a_value_read_during_an_outage_is_no_damaged_record(s3_server, s3_uri, caplog, monkeypatch):
    """Reading while the server is down said "skipping a damaged record", raised CorruptTensorRecord (which
    rules pass over as a missing value) and listed the step as damaged for good: the run is not damaged,
    the read fails and works again once the server is back."""
    hook = BaseHook(out_dir=s3_uri, save_config=smdebug.SaveConfig(save_interval=1))
    train(hook, range(0, 3))
    hook.close()
    trial = create_trial(s3_uri)
    assert trial.steps() == [0, 1, 2]
    s3_server.stop()
    reads = []
    read_ranges = Store.read_ranges
    monkeypatch.setattr(Store, "read_ranges", lambda self, *a: reads.append(a) or read_ranges(self, *a))
    with pytest.raises(OSError, match=r"could not read .*000000000002_worker_0\.tfevents") as info:
        trial.tensor("w").value(2)
    assert len(reads) == 1  # the store was asked (with its retries) once, not twice
    assert not isinstance(info.value, CorruptRunError)
    assert trial.corrupt_steps() == [] and "damaged" not in caplog.text
    s3_server.start()
    np.testing.assert_array_equal(trial.tensor("w").value(2), value(2))
    assert trial.corrupt_steps() == []
    no_credentials_in(caplog, str(info.value))


def test_a_long_outage_records_the_steps_past_the_bound_and_training_goes_on(s3_server, s3_uri, caplog):
    # The steps waiting for a failing store went to local disk, but their objects and index stayed in
    # memory, uncounted, for as long as the outage lasted (~2 KB a step whatever the bound). Now they hold
    # at most half of the bound; the steps past it are recorded unsaved, with the reason, and training
    # never waits for the store.
    caplog.set_level(logging.DEBUG, logger="smdebug")
    bound = 64 * 1024
    hook = BaseHook(out_dir=s3_uri, save_config=smdebug.SaveConfig(save_interval=1), max_queue_bytes=bound)
    train(hook, range(0, 2))
    hook._writer.flush()
    s3_server.stop()
    train(hook, range(2, 300))
    hook._writer.flush()
    writer = hook._writer
    assert writer.held_bytes <= bound
    waiting = writer.pending_steps
    assert 2 < len(waiting) < 100 and waiting == list(range(2, 2 + len(waiting)))
    s3_server.start()
    hook.close()
    trial = create_trial(s3_uri)
    assert trial.steps() == list(range(2 + len(waiting)))
    assert trial.unsaved_steps == list(range(2 + len(waiting), 300))
    reasons = set(trial.unsaved()["worker_0"].values())
    assert reasons == {next(iter(reasons))} and "memory bound (max_queue_bytes)" in next(iter(reasons))


def test_the_close_timeout_set_before_close_is_the_one_close_keeps(s3_server, s3_uri, monkeypatch):
    # docs/storage.md: close() returns within SMDEBUG_CLOSE_TIMEOUT; the variable was read when the hook
    # first saved, so a script setting it before close() waited the default 60 s on a store that is down
    hook = BaseHook(out_dir=s3_uri, save_config=smdebug.SaveConfig(save_interval=1))
    train(hook, range(0, 2))
    hook._writer.flush()
    s3_server.stop()
    train(hook, range(2, 4))
    monkeypatch.setenv("SMDEBUG_CLOSE_TIMEOUT", "2")
    began = time.monotonic()
    hook.close()
    assert time.monotonic() - began < 40  # the default would be 60 s
    assert sorted(hook.failed_steps) == [2, 3]


def test_a_long_outage_holds_no_file_descriptor_per_waiting_step(s3_server, s3_uri):
    # each step waiting on local disk for a failing store kept an open temp file: an outage longer than
    # the process's file limit (often 1024) failed every later step with "Too many open files"
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hook = BaseHook(out_dir=s3_uri, save_config=smdebug.SaveConfig(save_interval=1))
    train(hook, range(0, 2))
    hook._writer.flush()
    s3_server.stop()
    # a limit 100 above what is open now, and more waiting steps than that (each upload takes moto time)
    limit = min(soft, len(os.listdir("/proc/self/fd")) + 100)
    steps = limit + 50
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        train(hook, range(2, steps))
        hook._writer.flush()
        assert hook._writer.pending_steps == list(range(2, steps))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    s3_server.start()
    hook.close()
    assert hook.failed_steps == {}
    assert create_trial(s3_uri).steps() == list(range(steps))


@pytest.mark.parametrize("attempt", [0, 6], ids=["quick", "retried-by-the-client"])
def test_a_store_refusing_one_object_still_gets_the_record_and_the_end(
    s3_server, s3_uri, monkeypatch, attempt
):
    """The store answers everything but step 4's event file (503 SlowDown forever): steps 4-7 wait
    behind it and are lost at close. The record of them and the end-of-job marker were skipped because
    the store was "failing", though they would have been written: the run read as interrupted. An
    attempt may last past close's drain (the client retries a 503 itself, for seconds): close then
    writes them beside it."""
    from smdebug.store import StagedFile

    commit = StagedFile.commit

    def refuse_step_4(self):
        if self.relpath.startswith("events/000000000004/"):
            time.sleep(attempt)
            raise OSError("SlowDown: Please reduce your request rate (503)")
        commit(self)

    monkeypatch.setattr(StagedFile, "commit", refuse_step_4)
    monkeypatch.setenv("SMDEBUG_CLOSE_TIMEOUT", "4")
    hook = BaseHook(out_dir=s3_uri, save_config=smdebug.SaveConfig(save_interval=1))
    train(hook, range(8))
    began = time.monotonic()
    hook.close()
    assert time.monotonic() - began < 4 + 1
    assert sorted(hook._writer.failed_steps) == [4, 5, 6, 7]
    trial = create_trial(s3_uri)
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.unsaved_steps == [4, 5, 6, 7]
    assert trial.training_ended()


class _UnreachableStore(Store):
    """A worker's view of the store while its endpoint is down (another worker's is up)."""

    down = True

    @property
    def fs(self):
        if self.down:
            raise OSError("Could not connect to the endpoint URL")
        return super().fs


def test_two_workers_both_deciding_they_are_last_both_end_well(tmp_path):
    """Two workers closing at the same moment may both see every note and both write the marker, then
    remove the notes: the second's write finds the marker there, its removal finds the notes gone (a
    filesystem that says so: fsspec's memory one, or a store refusing to write over an object). A
    finished run's marker already there is success for it, not a file it could not save."""
    from smdebug.layout import END_OF_JOB_FILE, collections_file_path

    class Late(Store):  # its listing was made before its peer removed the notes
        def list(self, relprefix):
            if relprefix == "ended":
                return ["ended/worker_0.json", "ended/worker_1.json"]
            return super().list(relprefix)

        def write_bytes(self, relpath, data):
            if relpath == END_OF_JOB_FILE and self.exists(relpath):
                raise FileExistsError(relpath)
            super().write_bytes(relpath, data)

    uri = f"memory://{tmp_path.name}/run"
    first, late = Store(uri), Late(uri)
    writers = [RunWriter(first, "worker_0"), RunWriter(late, "worker_1")]
    for writer in writers:
        writer.write_file(
            collections_file_path(writer.worker), b'{"collections": {}, "_meta": {"num_workers": 2}}'
        )
        writer.write_tensor(0, ModeKeys.GLOBAL, 0, "w", value(0))
        writer.end_step(0)
        assert writer.flush(10)
    writers[1].write_file("ended/worker_1.json", b"{}")  # (its note was there when worker_0 listed)
    assert writers[1].flush(10)
    assert writers[0].close(timeout=10, end_of_job=2) == {}
    assert first.exists(END_OF_JOB_FILE)
    assert writers[1].close(timeout=10, end_of_job=2) == {}
    assert writers[0].failed_files == {} and writers[1].failed_files == {}
    assert first.list("ended") == []
