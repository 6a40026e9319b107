"""``smdebug diff`` and ``smdebug report`` over the two ranks of a real DDP job (each rank saves its own)."""

import os

import pytest
from support import run_ranks, smdebug_cli

DDP_WORKER = os.path.join(os.path.dirname(__file__), "diff_ddp_worker.py")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ddp") / "run")
    run_ranks(DDP_WORKER, out)
    return out


def test_two_ddp_ranks_weights_agree(ddp_run):
    from smdebug.trials import create_trial, diff

    workers = create_trial(ddp_run).workers()
    assert len(workers) == 2
    result = smdebug_cli("diff", ddp_run, "--workers", *workers, "--collection", "weights")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"workers {workers[0]} vs {workers[1]}" in result.stdout
    df = diff(ddp_run, workers=tuple(workers), collection="weights")
    assert len(df) == 2 and set(df["status"]) == {"agrees"} and (df["steps_compared"] == 4).all()
    # each rank saw its own data: their losses differ from the first step
    losses = smdebug_cli("diff", ddp_run, "--workers", *workers, "--collection", "losses")
    assert losses.returncode == 1 and "first differ at step 0" in losses.stdout


def test_report_of_a_ddp_run_says_which_worker_its_charts_show(ddp_run, tmp_path):
    from smdebug.trials import create_trial

    page = tmp_path / "ddp.html"
    assert smdebug_cli("report", ddp_run, "-o", page, "--no-rules").returncode == 0
    first = create_trial(ddp_run).workers()[0]
    assert f"2 worker(s) (charts: {first})" in page.read_text()
