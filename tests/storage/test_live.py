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


def test_a_lagging_workers_last_steps_of_an_index_folder_are_read_after_the_others_moved_on(
    tmp_path, monkeypatch
):
    """A refresh lists index/000000000 and then index/000000001; worker_1 wrote its steps 998-999 and then
    1000 between the two listings. Step 1000 made every step up to it complete, and the first folder was
    never listed again: worker_1's steps 998-999 were lost to the Trial for good."""
    import smdebug
    from smdebug.hook import BaseHook
    from smdebug.store import Store

    out_dir = str(tmp_path / "run")
    for worker in ("worker_0", "worker_1"):
        cls = type(
            worker, (BaseHook,), {"worker_name": lambda self, w=worker: w, "num_workers": lambda self: 2}
        )
        config = smdebug.SaveConfig(save_steps=[997, 998, 999, 1000])
        hook = cls(out_dir=out_dir, save_config=config, include_workers="all")
        for _ in range(1001):
            hook.begin_step()
            hook.save_tensor("w", np.array([hook.step]))
        hook.flush()
    listed, hidden = Store.list, set()
    monkeypatch.setattr(
        Store, "list", lambda store, prefix: [p for p in listed(store, prefix) if p not in hidden]
    )
    index = "index/{:09d}/{:012d}_worker_1.json"
    hidden.update(index.format(s // 1000, s) for s in (998, 999, 1000))  # worker_1 not there yet
    trial = create_trial(out_dir)
    assert trial.last_complete_step == 997
    hidden.discard(
        index.format(1, 1000)
    )  # the first folder listed before its steps 998-999, the second after
    trial.refresh()
    hidden.clear()
    trial.refresh()
    assert trial.tensor("w").workers(999) == ["worker_0", "worker_1"]
