"""Resume after preemption with xgboost.train: a job killed after a checkpoint and restarted with the
same checkpoint configuration (training on from the saved model) numbers its rounds on from the
checkpoint, in the same run (tests/conftest.py: Preemption)."""

from smdebug.modes import ModeKeys

SCRIPT = """
import os, signal, sys
import numpy as np
import xgboost as xgb
import smdebug.xgboost as smd

out_dir, (run, steps, checkpoint_at, kill_at) = sys.argv[1], map(int, sys.argv[2:])
path = os.path.join(os.environ["CKPT_DIR"], "model.json")
rng = np.random.default_rng(0)
train = xgb.DMatrix(rng.normal(size=(32, 3)), label=rng.normal(size=32))
done = xgb.Booster(model_file=path).num_boosted_rounds() if os.path.exists(path) else 0


class Checkpoint(xgb.callback.TrainingCallback):
    def after_iteration(self, model, epoch, evals_log):
        step = done + epoch
        hook.save_scalar("run", run)
        if step == checkpoint_at:
            model.save_model(path)
        if step == kill_at:
            hook.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return False


hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["metrics"])
xgb.train(
    {"max_depth": 2, "nthread": 1},
    train,
    num_boost_round=steps - done,
    evals=[(train, "train")],
    xgb_model=path if done else None,
    callbacks=[hook, Checkpoint()],
)
hook.close()
"""


def test_restarted_job_numbers_its_rounds_on_from_the_checkpoint(preemption, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    # killed after round 7, its checkpoint is of round 4: the restarted job boosts rounds 5 and 6 again
    preemption.run(script, run=1, steps=10, checkpoint_at=4, kill_at=7)
    done = preemption.run(script, run=2, steps=7)
    assert "removed worker_0's steps 5-7" in done.stderr  # what the first job saved after round 4
    trial = preemption.check({0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 2}, mode=ModeKeys.GLOBAL, seen=4)
    assert trial.tensor_names(collection="metrics") == ["train-rmse"]


# XGBoost's own checkpoint callback (model_<round>.ubj every `interval` rounds) listed before the hook (the
# test above has its checkpoint written after the hook's round): the checkpoint written in a round is
# recorded as of that round
OWN_CHECKPOINTS = """
import glob, os, signal, sys
import numpy as np
import xgboost as xgb
import smdebug.xgboost as smd

out_dir, (run, steps, checkpoint_every, kill_at) = sys.argv[1], map(int, sys.argv[2:])
folder = os.environ["CKPT_DIR"]
rng = np.random.default_rng(0)
train = xgb.DMatrix(rng.normal(size=(32, 3)), label=rng.normal(size=32))
saved = sorted(glob.glob(os.path.join(folder, "model_*.ubj")), key=os.path.getmtime)
latest = saved[-1] if saved else None
done = xgb.Booster(model_file=latest).num_boosted_rounds() if latest else 0


class Job(xgb.callback.TrainingCallback):
    def after_iteration(self, model, epoch, evals_log):
        hook.save_scalar("run", run)
        if done + epoch == kill_at:
            hook.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return False


hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["metrics"])
checkpoints = xgb.callback.TrainingCheckPoint(directory=folder, interval=checkpoint_every)
xgb.train(
    {"max_depth": 2, "nthread": 1},
    train,
    num_boost_round=steps - done,
    evals=[(train, "train")],
    xgb_model=latest,
    callbacks=[checkpoints, hook, Job()],
)
hook.close()
"""


def test_xgboost_checkpoint_callback_listed_before_the_hook(preemption, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(OWN_CHECKPOINTS)
    # TrainingCheckPoint(interval=4) writes model_4.ubj (rounds 0-4) in round 4; killed after round 6
    preemption.run(script, run=1, steps=10, checkpoint_at=4, kill_at=6)  # (checkpoint_every=4)
    assert sorted(p.name for p in preemption.folder.glob("model_*")) == ["model_4.ubj"]
    done = preemption.run(script, run=2, steps=8)
    assert "removed worker_0's steps 5, 6," in done.stderr
    runs = {step: 1 if step <= 4 else 2 for step in range(8)}
    trial = preemption.check(runs, mode=ModeKeys.GLOBAL, seen=4)
    # round 5, the first the restarted job boosts, is step 5: its metric goes on from round 4's
    rmse = trial.tensor("train-rmse")
    assert rmse.value(5)[0] < rmse.value(4)[0]
