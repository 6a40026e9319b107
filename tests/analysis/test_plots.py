"""smdebug.plots: the series drawn are the saved values, and the image is a real PNG."""

import sys

import numpy as np
import pytest
from conftest import TRAIN_STEPS

from smdebug.exceptions import SMDebugValueError
from smdebug.plots import match_tensors, plot, tensor_series

LOSS = "CrossEntropyLoss_output_0"


def test_scalar_tensor_series_per_mode(trial):
    series = {s.mode.name: s for s in tensor_series(trial, LOSS)}
    assert set(series) == {"TRAIN", "EVAL"}
    for mode, s in series.items():
        assert s.what == "value"
        assert s.steps == [trial.global_step(mode, ms) for ms in trial.tensor(LOSS).steps(mode=mode)]
        np.testing.assert_allclose(s.values, [float(trial.tensor(LOSS).value(g)) for g in s.steps])
    assert tensor_series(trial, LOSS, mode="EVAL")[0].steps == series["EVAL"].steps
    assert series["EVAL"].label == f"{LOSS} [EVAL]"


def test_large_tensor_defaults_to_its_l2_norm(trial):
    grad = trial.tensor_names(collection="gradients")[0]
    (s,) = tensor_series(trial, grad)
    assert s.what == "l2" and s.label == f"l2({grad}) [TRAIN]"
    expected = [float(np.linalg.norm(trial.tensor(grad).value(g).astype(np.float64))) for g in s.steps]
    np.testing.assert_allclose(s.values, expected, rtol=1e-5)


def test_requested_reduction_is_read_or_computed(trial):
    bias = trial.tensor_names(collection="biases")[0]
    (saved,) = tensor_series(trial, bias, reduction="abs_max", mode="TRAIN")
    assert saved.what == "abs_max"
    assert saved.values == [
        float(trial.tensor(bias).reduction_value(g, "max", abs=True)) for g in saved.steps
    ]
    (default,) = tensor_series(trial, bias, mode="TRAIN")  # reductions only: the saved l2 norm
    assert default.what == "l2"
    grad = trial.tensor_names(collection="gradients")[0]
    (computed,) = tensor_series(trial, grad, reduction="mean")
    np.testing.assert_allclose(
        computed.values, [trial.tensor(grad).value(g).mean() for g in computed.steps], rtol=1e-5
    )
    with pytest.raises(SMDebugValueError, match="unknown reduction"):
        tensor_series(trial, grad, reduction="average")


def test_match_tensors_names_and_regexes(trial):
    grads = trial.tensor_names(collection="gradients")
    assert match_tensors(trial, [LOSS]) == [LOSS]
    assert match_tensors(trial, ["^gradient/"]) == grads
    assert match_tensors(trial, ["loss"]) == [LOSS]  # case-insensitive when the exact case finds nothing
    with pytest.raises(SMDebugValueError, match="did you mean"):
        match_tensors(trial, ["CrossEntropyLoss_outptu_0"])


def test_plot_panels_and_png(trial, png, tmp_path):
    out = tmp_path / "two.png"
    grads = trial.tensor_names(collection="gradients")
    panels = plot(
        trial, [[LOSS], ["gradient/"]], str(out), log=[False, True], title="run", panel_titles=["a", "b"]
    )
    assert [[s.label for s in p] for p in panels] == [
        [f"{LOSS} [TRAIN]", f"{LOSS} [EVAL]"],
        [f"l2({g}) [TRAIN]" for g in grads],
    ]
    assert all(len(s.steps) == len(s.values) > 0 for p in panels for s in p)
    w2, h2 = png(out)
    one = tmp_path / "one.png"
    plot(trial, [LOSS], str(one))
    w1, h1 = png(one)
    assert w1 == w2 and h2 > 1.8 * h1  # one panel per group

    import matplotlib.image

    pixels = matplotlib.image.imread(str(out))
    assert pixels.shape[:2] == (h2, w2)
    assert pixels[..., :3].std() > 0.05  # not a blank image: curves, axes and text were drawn


def test_plot_svg_by_suffix(trial, tmp_path):
    out = tmp_path / "loss.svg"
    plot(trial, LOSS, str(out))
    assert out.read_text().lstrip().startswith("<?xml")


def test_plot_needs_matplotlib(trial, tmp_path, monkeypatch):
    from smdebug._optional import MissingDependencyError

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match="pip install matplotlib") as info:
        plot(trial, [LOSS], str(tmp_path / "x.png"))
    assert isinstance(info.value, MissingDependencyError)
    assert not (tmp_path / "x.png").exists()


def test_every_train_step_of_save_scalar_is_drawn(trial):
    (s,) = tensor_series(trial, "scalar/lr")
    assert s.steps == list(range(TRAIN_STEPS))


def test_a_damaged_record_is_left_out_of_plots_and_frames(run_dir, tmp_path, caplog):
    """A truncated event file costs only its own points, as values() leaves them out: the plot and the
    DataFrame of the rest are drawn and built, the damage warned of."""
    import shutil

    from smdebug.trials import create_trial, to_dataframe

    damaged = tmp_path / "run"
    shutil.copytree(run_dir, damaged)
    event = damaged / "events" / "000000000002" / "000000000002_worker_0.tfevents"
    event.write_bytes(event.read_bytes()[:40])
    trial = create_trial(str(damaged))
    name = "CrossEntropyLoss_output_0"
    kept = sorted(trial.tensor(name).values())
    assert 2 not in kept and kept
    assert [s for series in tensor_series(trial, name) for s in series.steps] == kept
    frame = to_dataframe(trial, collection="losses")
    assert sorted(frame[frame.tensor == name].step) == kept
    plot(trial, [name], str(tmp_path / "loss.png"))
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert "damaged record" in caplog.text
