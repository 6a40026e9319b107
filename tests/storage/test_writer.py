"""Off-thread writing: bounded memory (training waits, nothing is dropped), close() and exit flush."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import start_training

import smdebug
from smdebug.hook import BaseHook
from smdebug.modes import ModeKeys
from smdebug.store import Store
from smdebug.trials import create_trial
from smdebug.writing import RunWriter
from smdebug.writing.settings import DEFAULT_MAX_QUEUE_BYTES


class GatedStore(Store):
    """A real local Store whose writer thread waits at a gate before staging each event file."""

    def __init__(self, root):
        super().__init__(root)
        self.gate = threading.Event()

    def stage(self, relpath):
        self.gate.wait()
        return super().stage(relpath)


def test_full_queue_makes_training_wait_and_drops_nothing(tmp_path):
    store = GatedStore(str(tmp_path / "run"))
    writer = RunWriter(store, "worker_0", max_queue_bytes=1000)
    value = np.zeros(100, dtype=np.float32)  # 400 bytes: two fit, a third does not
    progress = []

    def train():
        for step in range(6):
            writer.write_tensor(step, ModeKeys.GLOBAL, step, "w", value + step)
            writer.end_step(step)
            progress.append(step)

    trainer = threading.Thread(target=train)
    trainer.start()
    trainer.join(timeout=1.0)
    assert trainer.is_alive(), "training should wait while the queue is full"
    assert len(progress) < 6
    assert writer.held_bytes <= 1000
    store.gate.set()
    trainer.join(timeout=30)
    assert not trainer.is_alive()
    assert writer.close() == {}
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == list(range(6))
    for step in range(6):
        np.testing.assert_array_equal(trial.tensor("w").value(step), value + step)


def test_a_tensor_larger_than_the_bound_is_still_saved(tmp_path):
    writer = RunWriter(Store(str(tmp_path / "run")), "worker_0", max_queue_bytes=16)
    big = np.arange(1000, dtype=np.float64)
    writer.write_tensor(0, ModeKeys.GLOBAL, 0, "big", big)
    writer.write_tensor(0, ModeKeys.GLOBAL, 0, "big2", big * 2)
    writer.end_step(0)
    writer.close()
    trial = create_trial(str(tmp_path / "run"))
    np.testing.assert_array_equal(trial.tensor("big2").value(0), big * 2)


def test_queue_bound_is_configurable(tmp_path, monkeypatch):
    assert BaseHook(out_dir=str(tmp_path / "a"), max_queue_bytes=12345)._get_writer().max_queue_bytes == 12345
    monkeypatch.setenv("SMDEBUG_MAX_QUEUE_BYTES", "2048")
    assert BaseHook(out_dir=str(tmp_path / "b"))._get_writer().max_queue_bytes == 2048
    monkeypatch.delenv("SMDEBUG_MAX_QUEUE_BYTES")
    assert BaseHook(out_dir=str(tmp_path / "c"))._get_writer().max_queue_bytes == DEFAULT_MAX_QUEUE_BYTES


def test_close_flushes_everything_queued(tmp_path):
    hook = BaseHook(out_dir=str(tmp_path / "run"), save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(50):
        hook.begin_step()
        hook.save_tensor("x", np.full((64, 64), step, dtype=np.float32))
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.training_ended()
    assert trial.tensor("x").steps() == list(range(50))
    assert trial.tensor("x").value(49)[0, 0] == 49


@pytest.mark.parametrize("where", ["local", "s3"])
def test_interpreter_exit_flushes_without_close(where, tmp_path, request):
    out_dir = str(tmp_path / "run") if where == "local" else request.getfixturevalue("s3_uri")
    proc = start_training(out_dir, 5, "--no-close")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "done" in out
    trial = create_trial(out_dir)
    assert trial.steps() == list(range(5))
    assert trial.training_ended()  # the hook was closed at exit, end marker included
    assert trial.tensor("gradient/Sequential_2.weight").value(4).shape == (4, 16)


def test_a_value_changed_after_saving_is_saved_as_it_was(tmp_path):
    """Writing happens later, off the training thread: the hook must have taken a copy."""
    hook = BaseHook(out_dir=str(tmp_path / "run"), save_config=smdebug.SaveConfig(save_interval=1))
    buffer = np.zeros(100_000)
    for step in range(5):
        hook.begin_step()
        buffer[:] = step  # updated in place, as optimizers do with weights
        hook.save_tensor("x", buffer)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert [float(trial.tensor("x").value(s)[0]) for s in range(5)] == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("published", [True, False], ids=["published", "in-outbox"])
def test_an_earlier_step_written_again_keeps_what_it_held(tmp_path, published):
    """More tensors for a step finished before the last one (a health recorder's rows written after the
    step's own saves, then a value saved into the trigger's step): the step's files are published again
    whole, not replaced by the new tensors alone."""
    store = GatedStore(str(tmp_path / "run"))
    if published:
        store.gate.set()
    writer = RunWriter(store, "worker_0")
    for step in range(3):
        writer.write_tensor(step, ModeKeys.TRAIN, step, "loss", np.float32(step))
        writer.end_step(step)
    for step in (1, 2, 1):
        writer.write_tensor(step, ModeKeys.TRAIN, step, f"later_{step}", np.arange(3) + step)
        writer.end_step(step)
    store.gate.set()
    assert writer.close() == {}
    trial = create_trial(str(tmp_path / "run"))
    for step in range(3):
        assert trial.tensor("loss").value(step) == step
        assert trial.mode_step(step) == step
    assert trial.tensor("later_1").steps() == [1] and trial.tensor("later_2").steps() == [2]
    np.testing.assert_array_equal(trial.tensor("later_1").value(1), [1, 2, 3])


def test_a_step_never_published_written_after_later_ones_asks_the_store_nothing(tmp_path):
    """An earlier step that saved nothing until now (a health recorder's row of an idle step) is a new
    step: the store is not asked for an index this writer never published (on S3, a request per row)."""

    class CountingStore(Store):
        reads = 0

        def read_bytes(self, relpath):
            CountingStore.reads += 1
            return super().read_bytes(relpath)

    writer = RunWriter(CountingStore(str(tmp_path / "run")), "worker_0")
    for step in (0, 2):
        writer.write_tensor(step, ModeKeys.TRAIN, step, "loss", np.float32(step))
        writer.end_step(step)
    writer.write_tensor(1, ModeKeys.TRAIN, 1, "row", np.float32(1))
    writer.end_step(1)
    assert writer.close() == {}
    assert CountingStore.reads == 0
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2] and trial.tensor("row").value(1) == 1
