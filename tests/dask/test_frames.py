"""to_dataframe over many runs: a pandas frame with a run column, or a lazy Dask DataFrame with one
partition per run whose computed values equal the pandas ones."""

from __future__ import annotations

import shutil

import dask.dataframe as dd
import pandas as pd

from smdebug.rules.sweep import find_runs
from smdebug.trials import create_trial, to_dataframe


def test_a_dask_frame_with_one_partition_per_run(sweep, client):
    runs = find_runs(sweep["root"] + "/run-0*")
    ddf = to_dataframe(runs, collection="losses", dask=True)
    assert isinstance(ddf, dd.DataFrame) and ddf.npartitions == len(runs) == 10
    got = ddf.compute().reset_index(drop=True)  # on the cluster: `client` is the default scheduler
    alone = pd.concat(
        [to_dataframe(create_trial(r), collection="losses").assign(run=r) for r in runs], ignore_index=True
    )
    assert list(got.columns) == ["run", *alone.columns[:-1]]
    assert got["run"].tolist() == alone["run"].tolist()
    pd.testing.assert_series_equal(got["value"], alone["value"], check_dtype=False)  # NaNs included
    # an aggregate across the sweep: the last loss of each run
    last = ddf[ddf.step == ddf.step.max()].groupby("run")["value"].first().compute()
    assert len(last) == len(runs)


def test_reductions_across_a_glob_in_pandas(sweep):
    df = to_dataframe(sweep["root"] + "/run-1[0-3]", regex="^gradient", reductions=["abs_mean"], values=False)
    assert df["run"].nunique() == 4 and list(df.columns)[-1] == "abs_mean"
    vanishing = [r for r, d in sweep["defects"].items() if d == "vanishing" and r.rsplit("-", 1)[1] < "14"]
    assert (df[df.run.isin(vanishing)]["abs_mean"] < 1e-7).any()


def test_a_folder_holding_runs_in_pandas(sweep, tmp_path):
    for name in ("run-00", "run-03"):  # a sweep folder of its own, without the damaged run
        shutil.copytree(f"{sweep['root']}/{name}", tmp_path / "sweep" / name)
    df = to_dataframe(str(tmp_path / "sweep"), collection="losses")
    runs = [str(tmp_path / "sweep" / name) for name in ("run-00", "run-03")]
    assert list(df.columns[:2]) == ["run", "tensor"] and df["run"].unique().tolist() == runs
    alone = to_dataframe(runs[1], collection="losses")  # one run: no run column
    assert "run" not in alone.columns
    pd.testing.assert_series_equal(
        df[df.run == runs[1]]["value"].reset_index(drop=True), alone["value"], check_dtype=False
    )
