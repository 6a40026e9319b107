"""Resume after preemption (smdebug.checkpoint_state): the hook watches the checkpoint folder of the
checkpoint configuration, records its state there when the script's checkpoint changes, and a hook
started later with the same configuration numbers its steps on from that state. Each framework's suite
runs a real job that is killed and restarted (test_resume.py); these check the core with its BaseHook."""

import json

import numpy as np
import pytest

import smdebug
from smdebug import checkpoint_state, modes
from smdebug.exceptions import OutDirExistsError
from smdebug.hook import BaseHook
from smdebug.trials import create_trial

KEYS = ["training-run", "latest-global-step-saved", "latest-global-step-seen", "latest-mode-step"]


def make_hook(out_dir, **kwargs):
    hook = BaseHook(out_dir=out_dir, include_collections=["weights"], **kwargs)
    hook.get_collection("weights").include("^w$")
    return hook


def train(hook, steps, checkpoint_before=None, folder=None, run=1, close=True):
    """A plugin's loop in TRAIN mode; "w" holds the run's number. The script writes its checkpoint file
    after the step before ``checkpoint_before``, whose number is in the file."""
    hook.set_mode(modes.TRAIN)
    for i in range(steps):
        if i == checkpoint_before:
            (folder / "model.ckpt").write_text(str(hook.step))
        if not hook.next_idle_step():
            hook.end_step()
            hook.begin_step()
        hook.save_for_step("w", np.array([run]))
    if close:
        hook.close()


def restart(monkeypatch):
    """What follows is a restarted job: another process (a hook never resumes from its own process's state)."""
    monkeypatch.setattr(checkpoint_state, "_PROCESS", checkpoint_state._PROCESS + "-restarted")


def states(folder):
    return json.loads((folder / "metadata.json").read_text())


def values(out_dir):
    trial = create_trial(out_dir)
    return {s: int(trial.tensor("w").value(s).item()) for s in trial.tensor("w").steps()}


@pytest.fixture(params=["inotify", "scan"])
def watch(request, monkeypatch):
    """Both ways of watching: inotify (Linux), and scans of the folder (elsewhere; here at every step)."""
    if request.param == "scan":
        monkeypatch.setattr(checkpoint_state._Inotify, "open", classmethod(lambda cls: None))
        monkeypatch.setattr(checkpoint_state, "SCAN_SECONDS", 0.0)
        monkeypatch.setattr(checkpoint_state, "SCAN_SHARE", 1.0)
    return request.param


def test_the_step_that_wrote_the_checkpoint_is_recorded(preemption, watch, tmp_path):
    hook = make_hook(str(tmp_path / "run"), save_config=smdebug.SaveConfig(save_interval=4))
    assert hook.checkpoints is not None and hook.checkpoints.folder == str(preemption.folder)
    train(hook, 10, checkpoint_before=6, folder=preemption.folder)  # idle steps 5 and 6 around it
    [state] = states(preemption.folder)
    assert list(state)[:4] == KEYS
    assert state["training-run"] == 0
    assert state["latest-global-step-seen"] == 5 == int((preemption.folder / "model.ckpt").read_text())
    assert state["latest-global-step-saved"] == 4
    assert state["latest-mode-step"] == {"GLOBAL": 5, "TRAIN": 5}
    assert state["out-dir"] == str(tmp_path / "run")


def test_a_checkpoint_after_the_last_step_is_recorded_at_close(preemption, tmp_path):
    hook = make_hook(str(tmp_path / "run"))
    train(hook, 3, close=False)
    (preemption.folder / "sub").mkdir()
    (preemption.folder / "sub" / "model.ckpt").write_bytes(b"x")
    hook.close()
    assert [s["latest-global-step-seen"] for s in states(preemption.folder)] == [2]


def test_nothing_is_recorded_while_the_checkpoint_stays_as_it_was(preemption, watch, tmp_path):
    (preemption.folder / "model.ckpt").write_bytes(b"old")  # the checkpoint the job started from
    (preemption.folder / "model.ckpt.sagemaker-uploaded").write_bytes(b"")  # SageMaker's marker
    hook = make_hook(str(tmp_path / "run"))
    train(hook, 4, close=False)
    (preemption.folder / "model.ckpt.sagemaker-uploaded").write_bytes(b"again")
    train(hook, 2)
    assert not (preemption.folder / "metadata.json").exists()


def test_a_restarted_hook_numbers_its_steps_on_from_the_latest_state(preemption, tmp_path):
    """A state file as smdebug 1.0 writes it (no out-dir): the latest step seen wins; entries that are not
    states are skipped. Written to a new out_dir, the steps go on from the state's."""
    written = [
        {KEYS[0]: 0, KEYS[1]: 9, KEYS[2]: 11, KEYS[3]: {"GLOBAL": 11, "TRAIN": 8, "EVAL": 2}},
        {KEYS[0]: 1, KEYS[1]: None, KEYS[2]: 21, KEYS[3]: {"GLOBAL": 21, "TRAIN": 16, "EVAL": 4}},
        {KEYS[0]: "", KEYS[1]: "", KEYS[2]: "", KEYS[3]: ""},  # (1.0's own test writes such a one)
    ]
    (preemption.folder / "metadata.json").write_text(json.dumps(written))
    out_dir = str(tmp_path / "run")
    hook = make_hook(out_dir, save_config=smdebug.SaveConfig(save_interval=1))
    assert (hook.step, hook.checkpoints.training_run, hook.last_saved_step) == (21, 2, None)
    train(hook, 2, close=False)
    hook.set_mode(modes.EVAL)
    hook.begin_step()
    hook.save_for_step("w", np.array([1]))
    hook.close()
    trial = create_trial(out_dir)
    assert trial.steps() == [22, 23, 24]
    assert [trial.mode_step(s) for s in trial.steps()] == [17, 18, 5]
    assert trial.steps(mode=modes.TRAIN) == [17, 18] and trial.steps(mode=modes.EVAL) == [5]


def test_a_job_restarted_into_its_run_goes_on_as_one_history(
    preemption, monkeypatch, tmp_path, caplog_smdebug
):
    """The first job checkpoints after step 4 and saves steps 5-7 before it ends; the restarted job
    trains from the checkpoint again: its steps 5 and 6 replace the first job's, step 7 is gone."""
    out_dir = str(tmp_path / "run")
    train(make_hook(out_dir, save_config=smdebug.SaveConfig(save_interval=1)), 8, 5, preemption.folder)
    assert list(values(out_dir)) == list(range(8))
    restart(monkeypatch)
    hook = make_hook(out_dir, save_config=smdebug.SaveConfig(save_interval=1))
    assert hook.step == 4 and hook.checkpoints.continues_run
    assert "removed worker_0's steps 5-7, saved after the checkpoint of step 4" in caplog_smdebug.text
    trial = create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3, 4] and not trial.loaded_all_steps  # the run goes on
    train(hook, 2, run=2)
    assert values(out_dir) == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 2}
    assert create_trial(out_dir).loaded_all_steps


def test_a_restarted_job_with_no_step_left_to_train_leaves_the_run_finished(
    preemption, monkeypatch, tmp_path
):
    out_dir = str(tmp_path / "run")
    train(make_hook(out_dir, save_config=smdebug.SaveConfig(save_interval=1)), 6, 5, preemption.folder)
    restart(monkeypatch)
    make_hook(out_dir, save_config=smdebug.SaveConfig(save_interval=1)).close()  # no step: all was trained
    trial = create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3, 4] and trial.loaded_all_steps


def test_a_restarted_job_keeps_the_runs_records_of_the_steps_up_to_its_checkpoint(
    preemption, monkeypatch, tmp_path
):
    """The earlier job's records of the steps it trained after the checkpoint go with those steps: a rule
    firing, a step it could not save, the first non-finite value (step 6); those of step 2 stay."""
    from smdebug import layout

    out_dir = tmp_path / "run"
    train(make_hook(str(out_dir), save_config=smdebug.SaveConfig(save_interval=1)), 8, 5, preemption.folder)
    fired = [{"rule": "r", "step": s, "mode": "TRAIN", "mode_step": s, "reason": "x"} for s in (2, 6)]
    first = {"worker": "worker_0", "step": 6, "mode": "TRAIN", "direction": "input", "tensor": "x"}
    records = {
        "rules/worker_0.json": json.dumps({"worker": "worker_0", "firings": fired, "more": 0}).encode(),
        "unsaved_steps/worker_0.json": layout.encode_unsaved("worker_0", {2: "lost", 6: "lost"}, {}),
        "health/worker_0.json": json.dumps(
            {"worker": "worker_0", "first_nonfinite": first, "triggers": []}
        ).encode(),
    }
    for relpath, data in records.items():
        (out_dir / relpath).parent.mkdir(exist_ok=True)
        (out_dir / relpath).write_bytes(data)
    restart(monkeypatch)
    train(make_hook(str(out_dir), save_config=smdebug.SaveConfig(save_interval=1)), 2, run=2)
    trial = create_trial(str(out_dir))
    assert trial.steps() == list(range(7)) and trial.unsaved_steps == [2]
    assert [f["step"] for f in trial.rule_firings()] == [2]
    assert trial.first_nonfinite() is None


def test_a_run_saved_in_the_checkpoint_folder_is_no_checkpoint(preemption, watch, tmp_path):
    hook = make_hook(str(preemption.folder / "tensors"), save_config=smdebug.SaveConfig(save_interval=1))
    train(hook, 6, checkpoint_before=3, folder=preemption.folder)
    assert [s["latest-global-step-seen"] for s in states(preemption.folder)] == [2]


def test_a_restarted_job_removes_the_unfinished_files_its_killed_job_left(
    preemption, monkeypatch, tmp_path, caplog_smdebug
):
    """The earlier job was killed while it wrote (its temp files stay beside their destinations); the
    restarted job of that worker removes them, never another worker's (it may be writing them now)."""
    out = tmp_path / "run"
    train(make_hook(str(out), save_config=smdebug.SaveConfig(save_interval=1)), 4, 3, preemption.folder)
    killed = "tmp-5f3a9c0e4242-7"  # as store._temp_name names them: <file>.tmp-<token><pid>-<n>
    left = [
        out / "index" / "000000000" / f"000000000003_worker_0.json.{killed}",
        out / "events" / "000000000003" / f"000000000003_worker_0.tfevents.{killed}",
        out / "unsaved_steps" / f"worker_0.json.{killed}",
    ]
    others = [
        out / "index" / "000000000" / f"000000000003_worker_1.json.{killed}",
        out / "events" / "000000000003" / f"000000000003_worker_10.tfevents.{killed}",
    ]
    for path in left + others:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half a file")
    restart(monkeypatch)
    hook = make_hook(str(out), save_config=smdebug.SaveConfig(save_interval=1))
    assert hook.checkpoints.continues_run
    assert [p.exists() for p in left] == [False] * 3 and all(p.exists() for p in others)
    assert "removed 3 unfinished file(s) the earlier job of worker_0 left" in caplog_smdebug.text
    train(hook, 2, run=2)
    assert values(str(out)) == {0: 1, 1: 1, 2: 1, 3: 2, 4: 2}


def test_a_value_saved_before_the_restarted_jobs_first_step_is_not_the_earlier_jobs(
    preemption, monkeypatch, tmp_path
):
    out_dir = str(tmp_path / "run")
    train(make_hook(out_dir, save_config=smdebug.SaveConfig(save_interval=1)), 4, 3, preemption.folder)
    restart(monkeypatch)
    hook = make_hook(out_dir, save_config=smdebug.SaveConfig(save_interval=1))
    hook.set_mode(modes.TRAIN)
    hook.save_scalar("lr", 0.5)  # before training: into its first step, the one after the checkpoint's (2)
    train(hook, 1, run=2)
    trial = create_trial(out_dir)
    assert trial.tensor("scalar/lr").steps() == [3] and trial.tensor("w").steps() == [0, 1, 2, 3]
    assert [trial.mode_step(s) for s in trial.steps()] == [0, 1, 2, 3]
    assert [int(trial.tensor("w").value(s).item()) for s in [0, 1, 2, 3]] == [1, 1, 1, 2]


def test_another_hook_of_the_same_job_resumes_but_never_takes_its_run_over(preemption, tmp_path):
    """As smdebug 1.0 (its spot-training test makes both hooks in one process): a later hook numbers its
    steps on from the state; but only a restarted job takes the run over, a second hook on the run of
    this process's first is refused, as without a checkpoint configuration, and the first's steps stay."""
    out_dir = str(tmp_path / "run")
    hook = make_hook(out_dir, save_config=smdebug.SaveConfig(save_interval=1))
    train(hook, 5, checkpoint_before=2, folder=preemption.folder, close=False)
    hook.flush()
    with pytest.raises(OutDirExistsError):
        make_hook(out_dir)
    later = make_hook(str(tmp_path / "other"), save_config=smdebug.SaveConfig(save_interval=1))
    assert later.step == 1 and not later.checkpoints.continues_run
    train(later, 2, run=2)
    assert values(str(tmp_path / "other")) == {2: 2, 3: 2}
    hook.close()
    assert list(values(out_dir)) == list(range(5))


def test_a_folder_made_after_the_hook_started_is_watched(preemption, monkeypatch, tmp_path):
    folder = tmp_path / "later"
    (tmp_path / "checkpointconfig.json").write_text(json.dumps({"LocalPath": str(folder)}))
    monkeypatch.setattr(checkpoint_state, "SCAN_SECONDS", 0.0)  # (scanned at most once a second)
    monkeypatch.setattr(checkpoint_state, "SCAN_SHARE", 1.0)
    hook = make_hook(str(tmp_path / "run"))
    train(hook, 3, close=False)
    folder.mkdir()
    train(hook, 3, checkpoint_before=1, folder=folder)
    assert [s["latest-global-step-seen"] for s in states(folder)] == [3]


def test_a_folder_made_at_the_first_checkpoint_records_its_step(preemption, tmp_path):
    """The script makes the folder as it writes its first checkpoint: its parent's watch sees it made (it
    was found by the scans of a missing folder, at most once a second, so at a later step)."""
    folder = tmp_path / "later"
    (tmp_path / "checkpointconfig.json").write_text(json.dumps({"LocalPath": str(folder)}))
    hook = make_hook(str(tmp_path / "run"))
    if hook.checkpoints._inotify is None:
        pytest.skip("inotify is Linux's")
    train(hook, 3, close=False)
    folder.mkdir()
    train(hook, 5, checkpoint_before=1, folder=folder)
    assert [s["latest-global-step-seen"] for s in states(folder)] == [3]


def test_no_watch_without_a_checkpoint_configuration_or_for_a_dry_run(preemption, monkeypatch, tmp_path):
    assert make_hook(str(tmp_path / "dry"), dry_run=True).checkpoints is None
    monkeypatch.delenv("CHECKPOINT_CONFIG_FILE_PATH")
    monkeypatch.setattr(checkpoint_state, "DEFAULT_CONFIG_PATH", str(tmp_path / "none.json"))
    hook = make_hook(str(tmp_path / "run"))
    assert hook.checkpoints is None
    train(hook, 3)


def test_a_broken_watch_never_breaks_training(preemption, monkeypatch, tmp_path, caplog_smdebug):
    (tmp_path / "checkpointconfig.json").write_text("{not json")
    hook = make_hook(str(tmp_path / "a"))
    assert hook.checkpoints is None and "ignoring the checkpoint configuration" in caplog_smdebug.text
    (tmp_path / "checkpointconfig.json").write_text(json.dumps({"LocalPath": str(preemption.folder)}))
    (preemption.folder / "metadata.json").write_text("[{")
    hook = make_hook(str(tmp_path / "b"), save_config=smdebug.SaveConfig(save_interval=1))
    assert hook.step == -1 and "metadata.json, which cannot be read" in caplog_smdebug.text

    def fail():
        raise OSError("disk full")

    monkeypatch.setattr(hook.checkpoints, "record", fail)
    train(hook, 6, checkpoint_before=2, folder=preemption.folder)
    assert list(values(str(tmp_path / "b"))) == list(range(6))
    assert caplog_smdebug.text.count("stopped watching the checkpoint folder") == 1
