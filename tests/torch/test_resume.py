"""Resume after preemption: a job killed after a checkpoint and restarted with the same checkpoint
configuration numbers its steps on from the checkpoint, in the same run (tests/conftest.py: Preemption)."""

from pathlib import Path

SCRIPT = Path(__file__).with_name("resume_train.py")


def test_restarted_job_numbers_its_steps_on_from_the_checkpoint(preemption):
    # killed after step 7, its checkpoint is of step 4: the restarted job trains steps 5 and 6 again
    preemption.run(SCRIPT, run=1, steps=10, checkpoint_at=4, kill_at=7)
    done = preemption.run(SCRIPT, run=2, steps=7)
    assert "removed worker_0's steps 5-7" in done.stderr  # what the first job saved after step 4
    trial = preemption.check({0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 2}, seen=4)
    # the later job's values: its weights at step 5 are the checkpoint's, trained once more
    assert set(trial.tensor_names(collection="weights")) == {"Linear_weight"}
    assert trial.tensor("Linear_weight").value(5).shape == (1, 3)
