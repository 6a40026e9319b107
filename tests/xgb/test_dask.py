"""xgboost.dask on a LocalCluster of two worker processes: each worker saves as worker_<collective rank>."""

import logging
import os
import time

import dask.array as da
import numpy as np
import pytest
import xgboost as xgb
from conftest import make_data
from distributed import Client, LocalCluster
from xgboost import dask as dxgb

import smdebug.xgboost as smd
from smdebug.stop_signal import write_stop_signal

PARAMS = {"max_depth": 3, "objective": "binary:logistic", "eval_metric": "logloss", "nthread": 1}


@pytest.fixture(scope="module")
def client():
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


@pytest.fixture
def dtrain(client):
    X, y = make_data(n=400)
    # one chunk per worker, so that both take part in the training
    return dxgb.DaskDMatrix(client, da.from_array(X, chunks=(200, 5)), da.from_array(y, chunks=200))


def train(client, dtrain, hook, rounds=4):
    return dxgb.train(
        client, PARAMS, dtrain, num_boost_round=rounds, evals=[(dtrain, "train")], callbacks=[hook]
    )


@pytest.mark.parametrize(
    "include_workers, workers", [("one", ["worker_0"]), ("all", ["worker_0", "worker_1"])]
)
def test_include_workers(client, dtrain, out_dir, include_workers, workers):
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_workers=include_workers,
        include_collections=["metrics", "feature_importance", "trees"],
    )
    result = train(client, dtrain, hook)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.training_ended()
    assert trial.workers() == workers
    assert trial.num_workers == len(workers)
    assert trial.steps() == [0, 1, 2, 3]
    collections_dir = os.path.join(out_dir, "collections", "000000000")
    assert sorted(os.listdir(collections_dir)) == [f"{w}_collections.json" for w in workers]
    history = result["history"]["train"]["logloss"]
    scores = result["booster"].get_score(importance_type="gain")
    for worker in workers:
        # the evaluation is global (an allreduce), the model the same on every worker
        saved = [trial.tensor("train-logloss").value(s, worker=worker)[0] for s in range(4)]
        assert saved == pytest.approx(history)
        assert trial.tensor("feature_importance/gain/f0").value(3, worker=worker)[0] == pytest.approx(
            scores["f0"] / sum(scores.values()), rel=1e-9
        )
        trees = result["booster"].trees_to_dataframe()
        nodes = trial.tensor("trees/Node").value(2, worker=worker)
        assert nodes.tolist() == trees[trees.Tree == 2].Node.tolist()


def test_worker_copies_leave_the_driver_hook_usable(client, dtrain, tmp_path):
    hook = smd.Hook(str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=2), include_workers="all")
    train(client, dtrain, hook, rounds=3)
    assert hook.step == -1 and not hook.closed  # the driver's hook saw no round itself
    hook.close()
    trial = smd.create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 2] and trial.workers() == ["worker_0", "worker_1"]
    np.testing.assert_array_equal(
        trial.tensor("train-logloss").value(2, worker="worker_0"),
        trial.tensor("train-logloss").value(2, worker="worker_1"),
    )


def test_dask_training_after_local_training_continues_the_steps(client, dtrain, tmp_path):
    X, y = make_data(n=100)
    hook = smd.Hook(str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    local = xgb.DMatrix(X, label=y)
    xgb.train(PARAMS, local, 2, evals=[(local, "local")], callbacks=[hook])  # steps 0 and 1, in this process
    train(client, dtrain, hook, rounds=2)  # steps 2 and 3, on the workers
    hook.close()
    trial = smd.create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.tensor("local-logloss").steps() == [0, 1]
    assert trial.tensor("train-logloss").steps() == [2, 3]


class SignalFromRankOne(xgb.callback.TrainingCallback):
    """Listed before the hook: on rank 1 only, at round 3, leaves the run's stop signal (as `smdebug rules
    --watch` does) after a pause, so that rank 0's hook has looked for it at that round already."""

    def __init__(self, out_dir):
        self.out_dir = out_dir

    def after_iteration(self, model, epoch, evals_log):
        if epoch == 3 and xgb.collective.get_rank() == 1:
            time.sleep(0.5)
            write_stop_signal(self.out_dir, "watcher", epoch, "stop")
        return False


def test_the_stop_signal_stops_every_worker_at_the_same_round(client, dtrain, tmp_path):
    # a worker that stopped alone left the others' next allreduce failing: training raised XGBoostError
    out_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_workers="all")
    result = dxgb.train(
        client,
        PARAMS,
        dtrain,
        num_boost_round=50,
        evals=[(dtrain, "train")],
        callbacks=[SignalFromRankOne(out_dir), hook],
    )
    hook.close()
    assert result["booster"].num_boosted_rounds() == 4
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.workers() == ["worker_0", "worker_1"]
    history = result["history"]["train"]["logloss"]
    for worker in trial.workers():
        assert trial.tensor("train-logloss").value(3, worker=worker)[0] == pytest.approx(history[3])


@pytest.mark.parametrize("include_workers", ["one", "all"])
def test_a_rule_added_to_the_hook_judges_the_workers_rounds_and_stops_them_all(
    client, tmp_path, include_workers
):
    # the workers' copies had no rules: a rule added with hook.add_rule never ran under xgboost.dask
    X, _ = make_data(n=400, features=8)
    noise = (np.random.default_rng(1).random(400) > 0.5).astype(float)
    dtrain = dxgb.DaskDMatrix(client, da.from_array(X, chunks=(200, 8)), da.from_array(noise, chunks=200))
    out_dir = str(tmp_path / "run")
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_workers=include_workers,
        include_collections=["trees"],
    )
    hook.add_rule("tree_depth", depth="3")  # max_depth=6 trees on noise are deeper than 3 from round 0
    params = {"max_depth": 6, "min_child_weight": 0, "objective": "binary:logistic", "nthread": 1}
    result = dxgb.train(client, params, dtrain, num_boost_round=20, callbacks=[hook])
    hook.close()
    assert result["booster"].num_boosted_rounds() == 1
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0]
    workers = ["worker_0", "worker_1"] if include_workers == "all" else ["worker_0"]
    firings = sorted((f["worker"], f["rule"], f["step"]) for f in trial.rule_firings())
    assert firings == [(worker, "TreeDepth", 0) for worker in workers]
    # the driver's hook holds the firings its workers' copies made (it judged no round itself)
    assert [(r.rule, r.step) for r in hook.rule_results] == [("TreeDepth", 0)] * len(workers)
    assert all(r.reason for r in hook.rule_results)
