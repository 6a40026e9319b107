"""smdebug.trials.to_dataframe: a run, or one tensor, as a tidy pandas DataFrame."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smdebug.exceptions import SMDebugValueError
from smdebug.trials import to_dataframe

LOSS = "CrossEntropyLoss_output_0"


def test_whole_trial(trial):
    df = to_dataframe(trial)
    assert list(df.columns[:6]) == ["tensor", "step", "mode", "mode_step", "worker", "value"]
    assert set(df["tensor"]) == set(trial.tensor_names())
    expected_rows = sum(len(trial.tensor(n).steps()) for n in trial.tensor_names())
    assert len(df) == expected_rows
    assert {"l2", "abs_max"} <= set(df.columns)  # the saved reductions (of the biases)
    assert df["step"].dtype == np.int64 and df["mode_step"].dtype == np.int64


def test_scalar_values_and_modes(trial):
    df = to_dataframe(trial, LOSS)
    assert list(df["step"]) == trial.tensor(LOSS).steps()
    for row in df.itertuples():
        assert row.mode == trial.mode(row.step).name
        assert row.mode_step == trial.mode_step(row.step)
        assert row.worker == "worker_0"
        assert row.value == pytest.approx(float(trial.tensor(LOSS).value(row.step)))
        assert isinstance(row.value, float)


def test_array_values_are_arrays(trial):
    weight = trial.tensor_names(collection="weights")[0]
    df = to_dataframe(trial, [weight], mode="TRAIN", steps=[0, 2])
    assert list(df["mode_step"]) == [0, 2]
    for row in df.itertuples():
        np.testing.assert_array_equal(row.value, trial.tensor(weight).value(row.step))


def test_reductions_requested_read_or_computed(trial):
    grads = trial.tensor_names(collection="gradients")
    bias = trial.tensor_names(collection="biases")[0]
    df = to_dataframe(trial, [*grads, bias], reductions=["l2", "abs_max", "mean"], values=False)
    assert list(df.columns) == ["tensor", "step", "mode", "mode_step", "worker", "l2", "abs_max", "mean"]
    for row in df[df["tensor"].isin(grads)].itertuples():
        value = trial.tensor(row.tensor).value(row.step)
        assert row.l2 == pytest.approx(np.linalg.norm(value.astype(np.float64)), rel=1e-5)
        assert row.abs_max == pytest.approx(np.abs(value).max())
        assert row.mean == pytest.approx(value.mean(), abs=1e-7)
    biases = df[df["tensor"] == bias]
    assert len(biases) > 0
    assert list(biases["l2"]) == pytest.approx(
        [trial.tensor(bias).reduction_value(s, "l2") for s in biases["step"]]
    )
    assert biases["mean"].isna().all()  # neither saved nor computable from a saved value


def test_collection_regex_and_mode_filters(trial):
    grads = to_dataframe(trial, collection="gradients")
    assert set(grads["tensor"]) == set(trial.tensor_names(collection="gradients"))
    assert set(grads["mode"]) == {"TRAIN"}
    evals = to_dataframe(trial, regex="Loss", mode="EVAL")
    assert set(evals["tensor"]) == {LOSS} and set(evals["mode"]) == {"EVAL"}
    assert list(evals["mode_step"]) == trial.tensor(LOSS).steps(mode="EVAL")
    assert len(to_dataframe(trial, LOSS, worker="worker_9")) == 0


def test_tensor_and_path_sources(trial, run_dir):
    from_tensor = to_dataframe(trial.tensor(LOSS))
    from_path = to_dataframe(run_dir, LOSS)
    pd.testing.assert_frame_equal(from_tensor, from_path)
    pd.testing.assert_frame_equal(to_dataframe(Path(run_dir), LOSS), from_path)  # as create_trial takes
    wide = from_path.pivot_table(index="step", columns="tensor", values="value")
    assert list(wide.index) == trial.tensor(LOSS).steps()


def test_bad_reduction_is_a_clear_error(trial):
    with pytest.raises(SMDebugValueError, match="unknown reduction 'avg'"):
        to_dataframe(trial, LOSS, reductions=["avg"])


def test_a_mistyped_collection_is_a_clear_error(trial, run_dir):
    """A collection the run has not is one error naming the nearest, not an empty frame."""
    with pytest.raises(SMDebugValueError, match="collection 'weigths' is not in .*did you mean 'weights'"):
        to_dataframe(trial, collection="weigths")
    with pytest.raises(SMDebugValueError, match="did you mean 'gradients'"):
        to_dataframe(run_dir, collection="gradient", regex="fc")
    assert len(to_dataframe(trial, collection="weights")) > 0


def test_pandas_is_optional(trial, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        to_dataframe(trial)
