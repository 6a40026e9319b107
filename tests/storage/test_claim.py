"""Two writers of one worker on one out_dir: the second is refused at creation, atomically (an exclusive
claim file, writers/<worker>.json: O_EXCL locally, a conditional PUT on S3), while distinct workers of one
distributed job still share the out_dir."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from conftest import start_training

import smdebug
from smdebug.exceptions import OutDirExistsError
from smdebug.hook import BaseHook
from smdebug.trials import create_trial


@pytest.fixture(params=["local", "s3"])
def out_dir(request, tmp_path):
    return str(tmp_path / "run") if request.param == "local" else request.getfixturevalue("s3_uri")


class Worker1(BaseHook):
    def worker_name(self):
        return "worker_1"

    def num_workers(self):
        return 2


def test_a_second_hook_of_the_same_worker_is_refused(out_dir):
    first = BaseHook(out_dir=out_dir, save_config=smdebug.SaveConfig(save_interval=1))
    with pytest.raises(OutDirExistsError, match=r"another writer of worker_0 \(host .*, pid \d+: writers/"):
        BaseHook(out_dir=out_dir)  # before the first has written anything
    first.begin_step()
    first.save_tensor("x", np.arange(3.0))
    first.close()
    assert create_trial(out_dir).steps() == [0]


def test_hooks_starting_together_exactly_one_wins(out_dir):
    barrier = threading.Barrier(6)
    won, refused = [], []

    def start():
        barrier.wait()
        try:
            won.append(BaseHook(out_dir=out_dir))
        except OutDirExistsError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 5


def test_distinct_workers_starting_together_share_the_out_dir(out_dir):
    hooks = [
        BaseHook(out_dir=out_dir, include_workers="all", save_config=smdebug.SaveConfig(save_interval=1)),
        Worker1(out_dir=out_dir, include_workers="all", save_config=smdebug.SaveConfig(save_interval=1)),
    ]
    for step in range(2):
        for i, hook in enumerate(hooks):
            hook.begin_step()
            hook.save_tensor("x", np.arange(3.0) + 10 * i + step)
    for hook in hooks:
        hook.close()
    trial = create_trial(out_dir)
    assert trial.workers() == ["worker_0", "worker_1"]
    assert trial.steps() == [0, 1]
    np.testing.assert_array_equal(trial.tensor("x").value(1, worker="worker_1"), np.arange(3.0) + 11)


def test_two_training_processes_starting_together(out_dir, tmp_path):
    go = tmp_path / "go"
    # the store's answer is waited for (a loaded machine's moto can take seconds) and the runs last
    # seconds: the claim decides, not which one finished before the other looked
    env = {**os.environ, "SMDEBUG_CHECK_TIMEOUT": "60"}
    procs = [start_training(out_dir, 5, "--go", str(go), "--sleep", "1", env=env) for _ in range(2)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    go.touch()  # both create their hook now
    results = [p.communicate(timeout=180) + (p.returncode,) for p in procs]
    ok = [r for r in results if r[2] == 0]
    failed = [r for r in results if r[2] != 0]
    assert len(ok) == 1 and len(failed) == 1, [r[1][-2000:] for r in results]
    # refused by the claim, or (the other already writing) by its files
    assert "worker_0" in failed[0][1] and "choose a new out_dir" in failed[0][1]
    trial = create_trial(out_dir)
    assert trial.steps() == list(range(5)) and trial.training_ended()


def test_a_writer_that_could_not_check_at_creation_refuses_when_it_writes(
    s3_server, s3_uri, monkeypatch, caplog
):
    monkeypatch.setenv("SMDEBUG_CHECK_TIMEOUT", "0.5")
    monkeypatch.setenv("SMDEBUG_CLOSE_TIMEOUT", "5")
    s3_server.stop()
    late = BaseHook(out_dir=s3_uri, save_config=smdebug.SaveConfig(save_interval=1))  # could not check
    s3_server.start()
    first = BaseHook(out_dir=s3_uri, save_config=smdebug.SaveConfig(save_interval=1))
    first.begin_step()
    first.save_tensor("x", np.zeros(3))
    first.flush()
    for _ in range(3):
        late.begin_step()
        late.save_tensor("x", np.ones(3))
    late.close()  # never raises into training
    first.close()
    assert sorted(late._writer.failed_steps) == [0, 1, 2]
    assert "already holds" in late._writer.failed_steps[0] and "worker_0" in late._writer.failed_steps[0]
    assert any(r.levelname == "ERROR" and "nothing is saved" in r.getMessage() for r in caplog.records)
    trial = create_trial(s3_uri)
    assert trial.steps() == [0]
    np.testing.assert_array_equal(trial.tensor("x").value(0), np.zeros(3))  # the first writer's, untouched


def test_a_hook_that_never_wrote_leaves_nothing_and_a_finished_run_keeps_no_claim(out_dir):
    from smdebug.store import Store

    unused = BaseHook(out_dir=out_dir)
    unused.close()  # never trained: its claim goes
    hook = BaseHook(out_dir=out_dir, save_config=smdebug.SaveConfig(save_interval=1))  # not refused
    hook.begin_step()
    hook.save_tensor("x", np.arange(3.0))
    hook.close()
    # once the end-of-job marker protects the run, it holds exactly smdebug 1.0's files
    store = Store(out_dir)
    assert store.list("writers") == []
    assert store.exists("training_job_end.ts")


def test_a_closed_unused_hook_leaves_no_folder(tmp_path):
    BaseHook(out_dir=str(tmp_path / "run")).close()
    assert not (tmp_path / "run").exists()
