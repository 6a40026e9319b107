"""Live reading: a Trial opened while training runs sees steps as they complete, never half a step."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import start_training

from smdebug.exceptions import NoMoreData
from smdebug.trials import create_trial

STEPS = 12
NAMES = {
    "MSELoss_output_0",
    *(f"{p}Sequential_{i}.{k}" for p in ("", "gradient/") for i in (0, 2) for k in ("weight", "bias")),
}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_trial_follows_a_running_training(where, tmp_path, request):
    out_dir = str(tmp_path / "run") if where == "local" else request.getfixturevalue("s3_uri")
    trial = create_trial(out_dir, refresh_interval=0.1)  # before anything is written
    assert trial.steps() == []
    proc = start_training(out_dir, STEPS, "--sleep", "0.25")
    try:
        with pytest.raises(TimeoutError, match="did not appear"):
            trial.wait_for_steps([STEPS + 50], timeout=0.5)
        seen_while_running = set()
        for step in range(STEPS):
            trial.wait_for_steps([step], timeout=120)
            if proc.poll() is None:
                seen_while_running.add(step)
            # every visible step is whole: all its tensors, every value readable
            for visible in trial.steps():
                assert set(trial.tensor_names(step=visible)) == NAMES
            for name in NAMES:
                assert np.all(np.isfinite(trial.tensor(name).value(step)))
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert len(seen_while_running) >= 2  # steps were read while training went on (not only at the end)
    trial.wait_for_steps(list(range(STEPS)), timeout=60)
    with pytest.raises(NoMoreData):  # once the run has ended, waiting for more stops
        trial.wait_for_steps([STEPS], timeout=60)
    assert trial.training_ended()
    assert trial.steps() == list(range(STEPS))


def test_refresh_lists_only_index_folders_still_being_written(tmp_path):
    import smdebug
    from smdebug.hook import BaseHook

    out_dir = str(tmp_path / "run")
    hook = BaseHook(out_dir=out_dir, save_config=smdebug.SaveConfig(save_interval=1))

    def steps(n):
        for _ in range(n):
            hook.begin_step()
            hook.save_tensor("x", np.array([hook.step]))
        hook.end_step()
        hook._writer.flush()

    steps(1500)
    trial = create_trial(out_dir)
    assert trial.steps() == list(range(1500))
    assert trial._done_index_dirs == {"index/000000000"}  # steps 0-999: no worker writes there any more
    listed = []
    original = trial.store.list
    trial.store.list = lambda prefix: listed.append(prefix) or original(prefix)
    steps(700)
    trial.refresh()
    assert "index" not in listed and "index/000000000" not in listed
    assert trial.steps() == list(range(2200))
    assert trial.tensor("x").value(2199)[0] == 2199
    hook.close()
