"""evaluate_runs over a sweep of 20 real runs: on a 2-worker LocalCluster the results equal the serial
evaluation exactly (and the single-run rule invoker's); planted defects fire their rules; a damaged run is
one error row and the others complete; the same on moto's S3 server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import N_RUNS

from smdebug.rules import create_rule, evaluate_rule
from smdebug.rules.sweep import evaluate_runs, find_runs
from smdebug.trials import create_trial

HERE = Path(__file__).parent

# the rule each planted defect must fire, and rules a healthy run must not fire
DEFECT_RULE = {
    "vanishing": "vanishing_gradient",
    "flat": "loss_not_decreasing",
    "exploding": "exploding_tensor",
}
HEALTHY_QUIET = ("vanishing_gradient", "exploding_tensor", "loss_not_decreasing")
RULES = [
    "vanishing_gradient",
    "exploding_tensor",
    "loss_not_decreasing",
    "weight_update_ratio",
    ("unchanged_tensor", {"collection_names": "weights", "num_steps": "4"}),
    "overtraining",
    "similar_across_runs",
]


@pytest.fixture(scope="module")
def serial(sweep):
    return evaluate_runs(sweep["root"], RULES, steps_per_task=7)


def _fired(df, run, rule) -> list:
    rows = df[(df.run == run) & (df.rule == rule)]
    assert len(rows) == 1, (run, rule)
    return rows.iloc[0]["fired_steps"]


def test_the_sweep_folder_holds_every_run(sweep):
    runs = find_runs(sweep["root"])
    assert len(runs) == N_RUNS + 2 and runs == sorted(runs)
    assert find_runs(sweep["root"] + "/run-0[0-4]") == runs[:5]


def test_dask_equals_serial(sweep, serial, client):
    parallel = evaluate_runs(sweep["root"], RULES, client=client, steps_per_task=7)
    pd.testing.assert_frame_equal(parallel, serial)


def test_planted_defects_fire_and_healthy_runs_do_not(sweep, serial):
    for run, defect in sweep["defects"].items():
        if defect is None:
            for rule in HEALTHY_QUIET:
                assert _fired(serial, run, rule) == [], (run, rule)
        else:
            assert _fired(serial, run, DEFECT_RULE[defect]), (run, defect)
    flat = next(r for r, d in sweep["defects"].items() if d == "flat")
    row = serial[(serial.run == flat) & (serial.rule == "loss_not_decreasing")].iloc[0]
    assert row.status == "fired" and row.tensors == ["MSELoss_output_0"] and "MSELoss_output_0" in row.reason


def test_a_damaged_run_is_one_error_row_and_the_others_complete(sweep, serial):
    damaged = serial[serial.run == sweep["damaged"]]
    assert len(damaged) == 1 and damaged.iloc[0].status == "error" and pd.isna(damaged.iloc[0].rule)
    assert "malformed collections file" in damaged.iloc[0].error
    others = serial[serial.run != sweep["damaged"]]
    assert len(others) == (N_RUNS + 1) * len(RULES) and not (others.status == "error").any()


def test_a_run_with_a_damaged_step_says_its_rows_skipped_it(sweep, client, tmp_path):
    """A run whose one step is damaged is judged without it, and each of its rows says so (the reader's
    warning goes to the log of the Dask worker, where the user never looks); the CLI lists such a row."""
    damaged = tmp_path / "one-bad-step"
    shutil.copytree(Path(sweep["root"]) / "run-00", damaged)
    index = sorted(damaged.glob("index/*/000000000005_*.json"))[0]
    index.write_text("{cut short")
    for where in ({}, {"client": client}):
        df = evaluate_runs([str(damaged)], ["exploding_tensor", "vanishing_gradient"], **where)
        assert list(df.status) == ["ok", "ok"], df
        assert list(df.note) == ["damaged steps skipped: 5"] * 2, df
    done = subprocess.run(
        [sys.executable, "-m", "smdebug", "rules", str(damaged), str(Path(sweep["root"]) / "run-02")]
        + ["--workers", "1", "--rule", "exploding_tensor"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "damaged steps skipped: 5" in done.stdout, done.stdout + done.stderr


def test_step_ranges_give_what_the_single_run_invoker_gives(sweep, serial):
    whole = evaluate_runs(sweep["root"], RULES, steps_per_task=10_000)
    pd.testing.assert_frame_equal(whole, serial)
    for run in list(sweep["defects"])[:8]:
        for name in ("vanishing_gradient", "exploding_tensor", "loss_not_decreasing", "weight_update_ratio"):
            alone = evaluate_rule(create_rule(name, create_trial(run)))
            assert _fired(serial, run, name) == alone, (run, name)


def test_runs_are_compared_with_the_baseline(sweep, serial):
    runs = find_runs(sweep["root"])
    twin, other = runs[20], runs[1]  # run-20 trained exactly as run-00 (the baseline); run-01 did not
    baseline_row = serial[(serial.run == runs[0]) & (serial.rule == "similar_across_runs")].iloc[0]
    assert baseline_row.status == "skipped"
    assert _fired(serial, twin, "similar_across_runs") == []
    assert _fired(serial, other, "similar_across_runs") == list(range(24))
    alone = evaluate_rule(
        create_rule("similar_across_runs", create_trial(other), other_trials=[create_trial(runs[0])])
    )
    assert _fired(serial, other, "similar_across_runs") == alone
    by_twin = evaluate_runs(runs[:3], ["similar_across_runs"], baseline=twin)
    assert list(by_twin.status) == ["ok", "fired", "fired"]


def test_a_baseline_spelled_otherwise_is_still_that_run(sweep, monkeypatch):
    runs = find_runs(sweep["root"])
    monkeypatch.chdir(sweep["root"])
    df = evaluate_runs(runs[:3], ["similar_across_runs"], baseline="run-01/")  # relative, trailing slash
    assert list(df.status) == ["fired", "skipped", "fired"]  # run-01 is not compared with itself
    assert "differs from run-01" in df.iloc[0].reason
    as_path = evaluate_runs([Path(r) for r in runs[:3]], ["similar_across_runs"], baseline=Path("run-01"))
    pd.testing.assert_frame_equal(as_path, df)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"baseline": "no-such-run"}, "baseline no-such-run: no such file or directory"),
        ({"steps_per_task": 0}, "steps_per_task must be at least 1, got 0"),
        ({"steps_per_task": -3}, "steps_per_task must be at least 1, got -3"),
        ({"workers": 0}, "workers must be at least 1, got 0"),
        ({"start_step": 5, "end_step": 5}, "end_step 5 leaves no step to evaluate (start_step 5)"),
        ({"runs": []}, "no runs given"),
    ],
)
def test_options_that_would_evaluate_nothing_are_errors(sweep, options, message):
    from smdebug.exceptions import SMDebugValueError

    options = {"runs": sweep["root"] + "/run-0[0-2]", **options}
    with pytest.raises(SMDebugValueError) as caught:
        evaluate_runs(rules=["similar_across_runs"], **options)
    assert str(caught.value) == message


def test_on_s3_the_same_results(s3_sweep, sweep, serial, client):
    on_s3 = evaluate_runs(s3_sweep, RULES, client=client, steps_per_task=7)
    local = serial.copy()
    local["run"] = local["run"].str.replace(sweep["root"], s3_sweep, regex=False)
    local["error"] = local["error"].str.replace(sweep["root"], s3_sweep, regex=False)
    local["reason"] = on_s3["reason"]  # similar_across_runs names the baseline run, the same in both
    pd.testing.assert_frame_equal(on_s3, local)


def test_rule_classes_and_rule_configs(sweep):
    from smdebug.rules import VanishingGradient, rule_configs

    runs = find_runs(sweep["root"])[:4]
    by_class = evaluate_runs(runs, [(VanishingGradient, {"threshold": 1e-3})])
    by_config = evaluate_runs(runs, [rule_configs.vanishing_gradient()])
    by_name = evaluate_runs(runs, ["vanishing_gradient"])
    assert list(by_config.fired_steps) == list(by_name.fired_steps)
    assert by_class.iloc[0].parameters == {"threshold": 0.001}
    assert (by_class.status == "fired").sum() >= (by_name.status == "fired").sum()


CUSTOM_RULE = """
from smdebug.rules.rule import Rule


class BigGradient(Rule):
    def __init__(self, base_trial, threshold="10.0"):
        super().__init__(base_trial)
        self.threshold = float(threshold)

    def invoke_at_step(self, step):
        return any(
            self.base_trial.tensor(n).reduction_value(step, "mean", abs=True) > self.threshold
            for n in self.base_trial.tensor_names(collection="gradients")
        )
"""


def test_a_custom_rule_from_its_source_file_on_the_workers(sweep, client, tmp_path):
    source = tmp_path / "my_rules.py"
    source.write_text(CUSTOM_RULE)
    runs = find_runs(sweep["root"])[:3]
    spec = (f"{source}:BigGradient", {"threshold": "0"})  # every saved step fires
    on_workers = evaluate_runs(runs, [spec], client=client)
    assert list(on_workers.status) == ["fired"] * 3, on_workers.error.tolist()
    assert on_workers.fired_steps.tolist() == evaluate_runs(runs, [spec]).fired_steps.tolist()
    assert on_workers.iloc[0].fired_steps == create_trial(runs[0]).steps()


WALKTHROUGH_RULE = """
from smdebug.rules.rule import Rule


class CustomGradientRule(Rule):
    def __init__(self, base_trial, other_trials, threshold="10.0"):
        super().__init__(base_trial, other_trials)
        self.threshold = float(threshold)

    def invoke_at_step(self, step):
        for tname in self.base_trial.tensor_names(collection="gradients"):
            t = self.base_trial.tensor(tname)
            abs_mean = t.reduction_value(step, "mean", abs=True)
            if abs_mean > self.threshold:
                return True
        return False
"""


def test_a_walkthrough_rule_judges_every_run_the_first_too(sweep, tmp_path):
    """The walkthrough's constructor takes other_trials (optional, it says): such a rule over a sweep
    judges each run, the first one included (it was skipped as 'the baseline of the comparison')."""
    source = tmp_path / "my_custom_rule.py"
    source.write_text(WALKTHROUGH_RULE)
    runs = find_runs(sweep["root"])[:3]
    df = evaluate_runs(runs, [(f"{source}:CustomGradientRule", {"threshold": "0"})])
    assert list(df.status) == ["fired"] * 3, df[["status", "error", "note"]]
    assert df.iloc[0].fired_steps == create_trial(runs[0]).steps()


def test_a_worker_lost_mid_task_is_retried(sweep, client, tmp_path):
    from sweep_runs import DiesOnceRule

    runs = find_runs(sweep["root"])[:6]
    rules = [(DiesOnceRule, {"marker": str(tmp_path / "killed")})]
    serial = evaluate_runs(runs, rules)
    parallel = evaluate_runs(runs, rules, client=client)
    assert (tmp_path / "killed").exists()  # a worker died during a task
    pd.testing.assert_frame_equal(parallel, serial)
    assert (serial.status == "fired").sum() >= 1


def test_a_sweep_stopped_by_an_error_leaves_nothing_running_on_the_cluster(sweep, client, tmp_path):
    """The cluster may be the user's: when the sweep ends early (an error, Ctrl-C), its queued tasks
    are cancelled and a task following a live run stops following it."""
    live = tmp_path / "live"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])),
    }
    cmd = [sys.executable, str(HERE / "sweep_runs.py"), str(live), "none", "900", "0.1"]
    writer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (live / "index").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

        def progress(done, total):
            if done >= 10:  # the live run is being followed by now, the finished run's tasks go on
                raise RuntimeError("stopped by the user")

        finished = sweep["root"] + "/run-00"  # 24 tasks of one step each
        with pytest.raises(RuntimeError, match="stopped by the user"):
            evaluate_runs(
                [str(live), finished],
                ["vanishing_gradient"],
                client=client,
                steps_per_task=1,
                progress=progress,
            )
        deadline = time.monotonic() + 15
        while any(client.processing().values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(client.processing().values()), client.processing()
        assert writer.poll() is None  # the run is still being written: its task would have followed it
    finally:
        writer.kill()
