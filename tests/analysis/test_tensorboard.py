"""TensorBoard summaries from the hook (export_tensorboard / tensorboard_dir) and from a saved run,
read back by TensorBoard's own event accumulator."""

from pathlib import Path

import numpy as np
import pytest
from conftest import EVAL_STEPS, SAVE_INTERVAL, TRAIN_STEPS, train

from smdebug.exceptions import TensorUnavailableForStep
from smdebug.modes import ModeKeys
from smdebug.tensorboard import SummaryWriter, export_tensorboard, summaries_for

TRAIN_SAVED = list(range(0, TRAIN_STEPS, SAVE_INTERVAL))  # global steps
EVAL_SAVED = list(range(TRAIN_STEPS, TRAIN_STEPS + EVAL_STEPS, SAVE_INTERVAL))


def _loss_name(trial):
    (name,) = trial.tensor_names(collection="losses")
    return name


def test_hook_writes_one_run_folder_per_mode(run_dir):
    folders = sorted(p.name for p in (Path(run_dir) / "tensorboard").iterdir())
    assert folders == ["EVAL", "TRAIN"]
    for folder in folders:
        files = list((Path(run_dir) / "tensorboard" / folder).iterdir())
        assert files and all(".tfevents" in f.name for f in files)


def test_hook_loss_scalars_match_the_saved_values(run_dir, trial, tb):
    loss = _loss_name(trial)
    for mode, steps in (("TRAIN", TRAIN_SAVED), ("EVAL", EVAL_SAVED)):
        read = tb(Path(run_dir) / "tensorboard" / mode)
        got = read["scalars"][loss]
        assert [s for s, _ in got] == steps
        expected = [float(trial.tensor(loss).value(s)) for s in steps]
        np.testing.assert_allclose([v for _, v in got], expected, rtol=1e-6)
        assert not any(loss in tag for tag in read["histograms"])  # scalar collections get no histogram


def test_hook_save_scalar_is_a_scalar_at_every_step(run_dir, trial, tb):
    got = tb(Path(run_dir) / "tensorboard" / "TRAIN")["scalars"]["scalar/lr"]
    assert [s for s, _ in got] == list(range(TRAIN_STEPS))
    np.testing.assert_allclose([v for _, v in got], [0.1 / (s + 1) for s in range(TRAIN_STEPS)], rtol=1e-6)


def test_hook_gradient_histograms_match_the_saved_tensors(run_dir, trial, tb):
    read = tb(Path(run_dir) / "tensorboard" / "TRAIN")
    grads = trial.tensor_names(collection="gradients")
    assert grads
    for name in grads:
        tag = f"gradients/{name}"
        assert [s for s, _ in read["histograms"][tag]] == TRAIN_SAVED
        for step, histo in read["histograms"][tag]:
            value = trial.tensor(name).value(step).astype(np.float64)
            assert histo.num == value.size
            assert histo.min == pytest.approx(value.min())
            assert histo.max == pytest.approx(value.max())
            assert histo.sum == pytest.approx(value.sum(), abs=1e-9)
            assert sum(histo.bucket) == value.size
    # gradients are not saved in EVAL, so that run has no gradient histograms
    eval_read = tb(Path(run_dir) / "tensorboard" / "EVAL")
    assert not [t for t in eval_read["histograms"] if t.startswith("gradients/")]


def test_hook_respects_save_histogram_false(run_dir, trial, tb):
    read = tb(Path(run_dir) / "tensorboard" / "TRAIN")
    weights = trial.tensor_names(collection="weights")
    assert weights and trial.tensor(weights[0]).value(0).size > 1
    assert not [t for t in read["histograms"] if t.startswith("weights/")]
    assert not [t for t in read["scalars"] if any(t.endswith(w) for w in weights)]


def test_hook_reductions_become_scalars(run_dir, trial, tb):
    read = tb(Path(run_dir) / "tensorboard" / "TRAIN")
    biases = trial.tensor_names(collection="biases")
    assert biases
    for name in biases:
        got = read["scalars"][f"smdebug/reductions/l2/{name}"]
        assert [s for s, _ in got] == TRAIN_SAVED
        expected = [trial.tensor(name).reduction_value(s, "l2") for s in TRAIN_SAVED]
        np.testing.assert_allclose([v for _, v in got], expected, rtol=1e-6)
        assert f"smdebug/reductions/abs_max/{name}" in read["scalars"]


def test_hook_reductions_only_collections_get_histograms_too(run_dir, trial, tb):
    """As smdebug 1.0: a collection saved as reductions only still gets its TensorBoard histograms (of
    the value the hook saw), read here by TensorBoard's own reader; the run holds only the reductions."""
    read = tb(Path(run_dir) / "tensorboard" / "TRAIN")
    biases = trial.tensor_names(collection="biases")
    for name in biases:
        got = read["histograms"][f"biases/{name}"]
        assert [s for s, _ in got] == TRAIN_SAVED
        for step, histo in got:
            assert histo.sum_squares == pytest.approx(trial.tensor(name).reduction_value(step, "l2") ** 2)
            largest = max(abs(histo.min), abs(histo.max))
            assert largest == pytest.approx(trial.tensor(name).reduction_value(step, "max", abs=True))
            assert sum(histo.bucket) == histo.num > 1
    with pytest.raises(TensorUnavailableForStep):  # the run itself holds the reductions only
        trial.tensor(biases[0]).value(TRAIN_SAVED[0])


def test_tensorboard_dir_option_without_export_flag(tmp_path, tb):
    tb_dir = tmp_path / "tb"
    train(tmp_path / "run", train_steps=2, eval_steps=0, tensorboard_dir=str(tb_dir))
    assert (tb_dir / "TRAIN").is_dir()
    assert "CrossEntropyLoss_output_0" in tb(tb_dir / "TRAIN")["scalars"]
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_no_tensorboard_files_unless_asked(tmp_path):
    train(tmp_path / "run", train_steps=2, eval_steps=0)
    assert not (tmp_path / "run" / "tensorboard").exists()
    assert (tmp_path / "run" / "index").is_dir()


def test_dry_run_writes_no_tensorboard_files(tmp_path):
    train(tmp_path / "run", train_steps=2, eval_steps=0, export_tensorboard=True, dry_run=True)
    assert not (tmp_path / "run").exists()


def test_a_tensorboard_failure_never_stops_training(tmp_path, caplog_smdebug):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the TensorBoard folder should go")
    hook = train(tmp_path / "run", tensorboard_dir=str(blocker))
    from smdebug.trials import create_trial

    trial = create_trial(str(tmp_path / "run"))
    # everything else was saved (save_scalar saves at every step)
    assert trial.steps() == list(range(TRAIN_STEPS)) + EVAL_SAVED
    assert trial.tensor(trial.tensor_names(collection="losses")[0]).steps() == TRAIN_SAVED + EVAL_SAVED
    assert hook.step == TRAIN_STEPS + EVAL_STEPS - 1
    assert any("TensorBoard export" in r.getMessage() for r in caplog_smdebug.records)


def test_export_of_a_saved_run_matches_the_hook(run_dir, trial, tb, tmp_path):
    counts = export_tensorboard(run_dir, str(tmp_path / "logs"))
    assert counts["scalars"] > 0 and counts["histograms"] > 0
    for mode in ("TRAIN", "EVAL"):
        live = tb(Path(run_dir) / "tensorboard" / mode)
        exported = tb(tmp_path / "logs" / mode)
        # a collection saved as reductions only (biases) has its histograms in the hook's export only
        live["histograms"] = {t: v for t, v in live["histograms"].items() if not t.startswith("biases/")}
        assert set(exported["histograms"]) == set(live["histograms"])
        # save_scalar values (scalar/lr) are saved at every step, the rest on the save interval
        assert set(exported["scalars"]) == set(live["scalars"])
        for tag, points in live["scalars"].items():
            assert [s for s, _ in exported["scalars"][tag]] == [s for s, _ in points]
            np.testing.assert_allclose([v for _, v in exported["scalars"][tag]], [v for _, v in points])
        for tag, points in live["histograms"].items():
            for (s1, h1), (s2, h2) in zip(points, exported["histograms"][tag]):
                assert s1 == s2 and h1.num == h2.num and list(h1.bucket) == list(h2.bucket)
    assert counts["scalars"] == sum(
        len(v) for m in ("TRAIN", "EVAL") for v in tb(tmp_path / "logs" / m)["scalars"].values()
    )


def test_export_takes_pathlib_paths(run_dir, tb, tmp_path):
    counts = export_tensorboard(Path(run_dir), tmp_path / "logs")  # as create_trial takes them
    assert counts == export_tensorboard(run_dir, str(tmp_path / "again"))
    assert [
        s for s, _ in tb(tmp_path / "logs" / "TRAIN")["scalars"]["CrossEntropyLoss_output_0"]
    ] == TRAIN_SAVED


def test_export_again_replaces_rather_than_duplicates(run_dir, tb, tmp_path):
    export_tensorboard(run_dir, str(tmp_path / "logs"))
    export_tensorboard(run_dir, str(tmp_path / "logs"))
    loss = tb(tmp_path / "logs" / "TRAIN")["scalars"]["CrossEntropyLoss_output_0"]
    assert [s for s, _ in loss] == TRAIN_SAVED


def test_summary_writer_to_memory_filesystem_uses_whole_objects(tb, tmp_path):
    import fsspec

    writer = SummaryWriter("memory://tbtest", mode=ModeKeys.TRAIN)
    writer.add_scalar("a", 1.5, 0)
    writer.flush()
    writer.add_scalar("a", 2.5, 3)
    writer.add_histogram("h", np.arange(10.0), 3)
    writer.close()
    fs = fsspec.filesystem("memory")
    files = sorted(fs.find("/tbtest/TRAIN"))
    assert len(files) == 2 and files[0] < files[1]
    for f in files:  # copy them out and let TensorBoard read them as one run
        (tmp_path / f.rsplit("/", 1)[1]).write_bytes(fs.cat_file(f))
    read = tb(tmp_path)
    assert read["scalars"]["a"] == [(0, 1.5), (3, 2.5)]
    assert read["histograms"]["h"][0][1].num == 10


def test_summaries_for_rules():
    from smdebug.collection import Collection

    grads, losses, hidden = (
        Collection("gradients"),
        Collection("losses"),
        Collection("x", save_histogram=False),
    )
    assert summaries_for("gradient/w", np.ones((2, 2)), [Collection("all"), grads]) == [
        ("histogram", "gradients/gradient/w")
    ]
    assert summaries_for("loss", np.array(0.5), [losses]) == [("scalar", "loss")]
    assert summaries_for("w", np.ones(3), [hidden]) == []
    assert summaries_for("flags", np.ones(3, dtype=bool), [grads]) == []
    assert summaries_for("smdebug/reductions/l2/w", np.array([1.0]), []) == [
        ("scalar", "smdebug/reductions/l2/w")
    ]


def test_json_config_tensorboard_output_and_save_histogram(tmp_path, tb):
    """The SageMaker JSON form: TensorBoardOutputConfig.LocalPath, and save_histogram per collection."""
    import json

    from conftest import Net, batch
    from numpy_training import SGD, CrossEntropyLoss, NumpyHook, train_step

    config = {
        "LocalPath": str(tmp_path / "run"),
        "TensorBoardOutputConfig": {"LocalPath": str(tmp_path / "tb")},
        "HookParameters": {"save_interval": "1"},
        "CollectionConfigurations": [
            {"CollectionName": "gradients", "CollectionParameters": {"save_histogram": "false"}},
            {"CollectionName": "weights"},
            {"CollectionName": "losses"},
        ],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    hook = NumpyHook.create_from_json_file(str(path))
    model, loss_fn, rng = Net(), CrossEntropyLoss(), np.random.default_rng(0)
    for _ in range(3):
        train_step(hook, model, *batch(rng, 8), loss_fn, SGD(0.0))  # gradients, no update
    hook.close()
    read = tb(tmp_path / "tb" / "GLOBAL")
    assert [s for s, _ in read["scalars"]["CrossEntropyLoss_output_0"]] == [0, 1, 2]
    assert read["histograms"] and all(t.startswith("weights/") for t in read["histograms"])


def test_non_finite_values_never_stop_the_export(tmp_path, tb):
    """An exploding tensor (all NaN) gets no histogram; the others, and later steps, are still exported."""
    from conftest import Net, batch
    from numpy_training import SGD, CrossEntropyLoss, NumpyHook, train_step

    import smdebug

    hook = NumpyHook(
        out_dir=str(tmp_path / "run"),
        tensorboard_dir=str(tmp_path / "tb"),
        save_config=smdebug.SaveConfig(save_interval=1),
        include_collections=["losses"],
    )
    model, loss_fn, rng = Net(), CrossEntropyLoss(), np.random.default_rng(0)
    for _ in range(3):
        train_step(hook, model, *batch(rng, 8), loss_fn, SGD(0.0))
        hook.save_tensor("probe/all_nan", np.full(4, np.nan), "probes")
        hook.save_tensor("probe/some_nan", np.array([1.0, np.nan, 3.0, np.inf]), "probes")
    hook.close()
    read = tb(tmp_path / "tb" / "GLOBAL")
    assert "probes/probe/all_nan" not in read["histograms"]
    some_nan = read["histograms"]["probes/probe/some_nan"]
    assert [(s, h.num, h.min, h.max) for s, h in some_nan] == [
        (0, 2, 1.0, 3.0),
        (1, 2, 1.0, 3.0),
        (2, 2, 1.0, 3.0),
    ]
    assert [s for s, _ in read["scalars"]["CrossEntropyLoss_output_0"]] == [0, 1, 2]


def test_export_of_a_damaged_run_skips_the_damaged_records_and_exports_the_rest(run_dir, tb, tmp_path):
    """A truncated event file (a copy cut mid-step) costs only its own values: the export goes on, says
    how many it skipped, and exits 0 (it stopped at the first one with an error)."""
    import shutil

    from support import smdebug_cli

    damaged = tmp_path / "run"
    shutil.copytree(run_dir, damaged)
    event = damaged / "events" / "000000000002" / "000000000002_worker_0.tfevents"
    event.write_bytes(event.read_bytes()[:40])
    result = smdebug_cli("export-tensorboard", damaged, tmp_path / "logs")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "skipped" in result.stdout and "damaged value(s)" in result.stdout
    assert "damaged record" in result.stderr and "000000000002_worker_0.tfevents" in result.stderr
    loss = tb(tmp_path / "logs" / "TRAIN")["scalars"]["CrossEntropyLoss_output_0"]
    assert [s for s, _ in loss] == [s for s in TRAIN_SAVED if s != 2]
    counts = export_tensorboard(str(damaged), str(tmp_path / "again"))
    assert counts["damaged"] > 0 and counts["scalars"] > 0
