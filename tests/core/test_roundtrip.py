"""A run written with the core alone (BaseHook) reads back through the Trial API with exact values."""

import json
import logging
import os
import time

import numpy as np
import pytest

import smdebug
from smdebug import modes, plugins
from smdebug.exceptions import (
    ConfigError,
    InvalidWorker,
    NoMoreData,
    SMDebugTypeError,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from smdebug.hook import BaseHook
from smdebug.trials import create_trial

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


def every_step():
    return smdebug.SaveConfig(save_interval=1)


def test_every_dtype_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {f"t_{d}": (rng.standard_normal((3, 4)) * 50).astype(d) for d in DTYPES}
    arrays["scalar0d"] = np.array(3.5, dtype=np.float32)  # (a numpy scalar is saved with shape (1,))
    arrays["scalar1"] = np.array([7], dtype=np.int64)
    arrays["empty"] = np.zeros((0, 3), dtype=np.float32)
    arrays["large"] = rng.standard_normal(1_500_000).astype(np.float32)
    arrays["strided"] = np.arange(40, dtype=np.float64).reshape(5, 8)[:, ::3]
    hook = BaseHook(out_dir=str(tmp_path / "run"))
    hook.begin_step()
    for name, value in arrays.items():
        hook.save_tensor(name, value)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(collection="default") == sorted(arrays)
    for name, value in arrays.items():
        got = trial.tensor(name).value(0)
        expected = np.asarray(value)
        assert got.dtype == expected.dtype, name
        assert got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected)


def test_bfloat16_like_values_saved_readably(tmp_path):
    # ml_dtypes' bfloat16 may not be installed; plugins convert bfloat16 to float32 before saving
    hook = BaseHook(out_dir=str(tmp_path / "run"))
    hook.begin_step()
    hook.save_tensor("x", np.array([1.5, -2.0], dtype=np.float32))
    hook.close()
    assert create_trial(str(tmp_path / "run")).tensor("x").value(0).tolist() == [1.5, -2.0]


def test_out_dir_and_tensorboard_dir_may_be_paths(tmp_path):
    hook = BaseHook(out_dir=tmp_path / "run", export_tensorboard=True, tensorboard_dir=tmp_path / "tb")
    assert (hook.out_dir, hook.options.tensorboard_dir) == (str(tmp_path / "run"), str(tmp_path / "tb"))
    hook.begin_step()
    hook.save_tensor("loss", np.float32(1.5))
    hook.close()
    assert create_trial(tmp_path / "run").tensor("loss").value(0) == 1.5
    assert os.listdir(tmp_path / "tb")


def test_many_steps_and_modes(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out, save_config=every_step(), include_collections=["weights"])
    hook.get_collection("weights").include("w.*")
    hook.set_mode(modes.TRAIN)
    for i in range(30):
        hook.begin_step()
        hook.save_for_step("w1", np.full(4, i, dtype=np.float32))
        hook.save_for_step("ignored", np.ones(2))
    hook.set_mode(modes.EVAL)
    for i in range(5):
        hook.begin_step()
        hook.save_for_step("w1", np.full(4, 100 + i, dtype=np.float32))
    hook.close()
    trial = create_trial(out_dir=out)
    assert trial.steps() == list(range(35))
    assert trial.steps(mode=modes.TRAIN) == list(range(30))
    assert trial.steps(mode=modes.EVAL) == list(range(5))
    assert trial.mode_modestep(32) == (modes.EVAL, 2)
    assert trial.global_step(modes.EVAL, 2) == 32
    assert trial.tensor_names() == ["w1"] == trial.tensors()
    t = trial.tensor("w1")
    assert t.value(3, mode=modes.EVAL).tolist() == [103.0] * 4
    assert t.value(33).tolist() == [103.0] * 4
    assert t.value(29, mode=modes.TRAIN)[0] == 29
    assert t.steps(mode=modes.EVAL) == list(range(5))
    assert trial.modes() == [modes.TRAIN, modes.EVAL]  # in the order they first appear
    with pytest.raises(NoMoreData):
        trial.wait_for_steps([40])
    trial.wait_for_steps([0, 10, 34])  # finished run: returns at once


def test_inputs_labels_and_predictions_of_a_step_in_their_numbered_order(tmp_path):
    # smdebug 1.0's Trial shortcuts (its rules read them); Keras saves labels_<i>, XGBoost labels
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out, save_config=every_step())
    for mode in (modes.TRAIN, modes.EVAL):
        hook.set_mode(mode)
        for step in range(2):
            hook.begin_step()
            for i in (10, 2):
                hook.save_tensor(f"model_input_{i}", np.full(2, 100 * mode.value + 10 * step + i), "inputs")
                hook.save_tensor(f"predictions_{i}", np.full(3, 10 * step + i), "outputs")
            hook.save_tensor("labels", np.arange(4) + step, "outputs")
    hook.close()
    trial = create_trial(out)
    assert [v[0] for v in trial.inputs(1, mode=modes.EVAL)] == [212, 220]  # its own mode step
    assert [v[0] for v in trial.inputs(1)] == [112, 120]  # global step 1: TRAIN's second
    assert [v[0] for v in trial.predictions(0, mode=modes.TRAIN)] == [2, 10]
    assert [v.tolist() for v in trial.labels(3)] == [[1, 2, 3, 4]]
    assert trial.labels(9) == []


def test_save_interval_is_respected(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(
        out_dir=out, save_config=smdebug.SaveConfig(save_interval=10), include_collections=["weights"]
    )
    hook.get_collection("weights").include("w")
    for _ in range(35):
        hook.begin_step()
        hook.save_for_step("w", np.ones(2))
    hook.close()
    trial = create_trial(out)
    assert trial.steps() == [0, 10, 20, 30]
    with pytest.raises(StepUnavailable):
        trial.tensor("w").value(5)
    # no mode was set: the steps are GLOBAL's, which modes() leaves out as smdebug 1.0 does
    assert trial.modes() == [] and trial.modes(include_global=True) == [modes.GLOBAL]


def test_collection_config_overrides_hook(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(
        out_dir=out, save_config=smdebug.SaveConfig(save_interval=5), include_collections=["a", "b"]
    )
    hook.get_collection("a").include("x")
    hook.get_collection("b").include("y")
    hook.get_collection("b").save_config = smdebug.SaveConfig(save_interval=2)
    for _ in range(7):
        hook.begin_step()
        hook.save_for_step("x", np.ones(1))
        hook.save_for_step("y", np.ones(1))
    hook.close()
    trial = create_trial(out)
    assert trial.tensor("x").steps() == [0, 5]
    assert trial.tensor("y").steps() == [0, 2, 4, 6]
    assert trial.tensor_names(collection="b") == ["y"]


def test_end_step_zero_disables_a_default_collection(tmp_path):
    class Hook(BaseHook):
        default_include_collections = ("losses",)

    out = str(tmp_path / "run")
    hook = Hook(out_dir=out, save_config=every_step(), include_collections=["weights"])
    hook.get_collection("losses").include("loss")
    hook.get_collection("weights").include("w")
    hook.get_collection("losses").save_config.end_step = 0
    for _ in range(3):
        hook.begin_step()
        hook.save_for_step("loss", np.float32(1.0))
        hook.save_for_step("w", np.ones(2))
    hook.close()
    assert create_trial(out).tensor_names() == ["w"]


def test_reductions_stored_and_computed(tmp_path):
    out = str(tmp_path / "run")
    rc = smdebug.ReductionConfig(
        reductions=["mean", "max"], abs_reductions=["min"], norms=["l2"], abs_norms=["l1"]
    )
    hook = BaseHook(
        out_dir=out, save_config=every_step(), reduction_config=rc, include_collections=["gradients"]
    )
    hook.get_collection("gradients").include("gradient/.*")
    value = np.array([[3.0, -4.0], [0.5, -0.5]], dtype=np.float32)
    hook.begin_step()
    hook.save_for_step("gradient/fc.weight", value)
    hook.close()
    trial = create_trial(out)
    assert trial.tensor_names() == ["gradient/fc.weight"]
    t = trial.tensor("gradient/fc.weight")
    assert t.reduction_value(0, "mean") == pytest.approx(value.mean())
    assert t.reduction_value(0, "max") == pytest.approx(3.0)
    assert t.reduction_value(0, "min", abs=True) == pytest.approx(0.5)
    assert t.reduction_value(0, "l2") == pytest.approx(np.sqrt((value**2).sum()))
    assert t.reduction_value(0, "l1", abs=True) == pytest.approx(8.0)
    with pytest.raises(TensorUnavailableForStep) as info:
        t.value(0)  # only reductions were saved
    assert info.value.has_reductions
    with pytest.raises(TensorUnavailableForStep):
        t.reduction_value(0, "std")  # neither stored nor computable
    index = json.loads(open(os.path.join(out, "index/000000000/000000000000_worker_0.json")).read())
    names = {e["tensorname"] for e in index["tensor_payload"]}
    assert "smdebug/reductions/abs_l1/gradient/fc.weight" in names
    assert "smdebug/reductions/mean/gradient/fc.weight" in names


def test_reduction_computed_from_raw_value(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out)
    hook.begin_step()
    hook.save_tensor("t", np.array([1.0, -3.0, 2.0]))
    hook.close()
    t = create_trial(out).tensor("t")
    assert t.reduction_value(0, "min") == -3.0
    assert t.reduction_value(0, "max", abs=True) == 3.0
    assert t.reduction_value(0, "median") == 1.0


def test_save_scalar_and_layout(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out)
    hook.begin_step()
    hook.save_scalar("lr", 0.1)
    hook.close()
    assert sorted(os.listdir(out)) == ["collections", "events", "index", "training_job_end.ts"]
    assert os.path.exists(os.path.join(out, "events/000000000000/000000000000_worker_0.tfevents"))
    assert os.path.exists(os.path.join(out, "collections/000000000/worker_0_collections.json"))
    assert create_trial(out).tensor("scalar/lr").value(0).tolist() == pytest.approx([0.1])


def _steps_by_mode(out):
    trial = create_trial(out)
    return {mode.name: trial.steps(mode=mode) for mode in (modes.TRAIN, modes.EVAL)}, trial


@pytest.mark.parametrize("mode", [modes.TRAIN, modes.EVAL])
def test_a_value_saved_before_the_first_step_goes_into_it(tmp_path, mode):
    """As smdebug 1.0: saved before training, a scalar or tensor is written into the first step, which
    keeps its number (0) and mode, whatever mode was set when it was saved."""
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out, save_config=every_step())
    hook.set_mode(mode)
    hook.save_scalar("lr", 0.1)
    hook.save_tensor("labels", np.arange(3), "custom")
    hook.set_mode(modes.TRAIN)
    for _ in range(2):
        hook.begin_step()
        hook.save_scalar("loss", 1.0)
        hook.end_step()
    hook.close()
    steps, trial = _steps_by_mode(out)
    assert steps == {"TRAIN": [0, 1], "EVAL": []} and trial.steps() == [0, 1]
    assert trial.tensor("scalar/lr").steps() == [0] and trial.tensor("labels").steps() == [0]
    assert trial.tensor("labels").value(0).tolist() == [0, 1, 2]


def test_a_value_saved_between_steps_goes_into_the_last_one_and_starts_no_mode(tmp_path):
    """Saved after the TRAIN steps and before the first EVAL step, a scalar is written into the last
    TRAIN step, under its mode and mode step; EVAL's mode steps still start at 0."""
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out, save_config=every_step())
    hook.set_mode(modes.TRAIN)
    for _ in range(2):
        hook.begin_step()
        hook.save_scalar("loss", 1.0)
    hook.end_step()
    hook.set_mode(modes.EVAL)
    hook.save_scalar("accuracy", 0.5)
    for _ in range(2):
        hook.begin_step()
        hook.save_scalar("loss", 2.0)
    hook.close()
    steps, trial = _steps_by_mode(out)
    assert steps == {"TRAIN": [0, 1], "EVAL": [0, 1]} and trial.steps() == [0, 1, 2, 3]
    assert trial.tensor("scalar/accuracy").steps() == [1]
    assert trial.mode_modestep(1) == (modes.TRAIN, 1)


def test_a_value_saved_with_no_step_at_all_is_step_0(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out)
    hook.save_scalar("lr", 0.1)
    hook.close()
    assert create_trial(out).tensor("scalar/lr").steps() == [0]


def test_a_numpy_scalar_is_saved_with_shape_1_as_a_python_one(tmp_path):
    """smdebug 1.0 saves any scalar a user gives (np.mean's np.float64 included) as a 1-element array:
    ``value(step)[0]`` works whichever kind of scalar the script had."""
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out)
    hook.begin_step()
    hook.save_scalar("mean_acc", np.mean([0.5, 1.0]))
    hook.save_scalar("f32", np.float32(2.5))
    hook.save_tensor("count", np.int64(7), "custom")
    hook.save_tensor("arr0d", np.array(1.5), "custom")  # an array keeps its shape
    hook.close()
    trial = create_trial(out)
    for name, dtype, expected in (
        ("scalar/mean_acc", np.float64, 0.75),
        ("scalar/f32", np.float32, 2.5),
        ("count", np.int64, 7),
    ):
        value = trial.tensor(name).value(0)
        assert value.shape == (1,) and value.dtype == dtype and value[0] == expected, name
    assert trial.tensor("arr0d").value(0).shape == ()


def test_save_scalar_timestamp_is_the_event_wall_time(tmp_path):
    from smdebug import codec

    out = tmp_path / "run"
    hook = BaseHook(out_dir=str(out))
    hook.begin_step()
    hook.save_scalar("given", 2.0, timestamp=1234567890.5)
    hook.save_scalar("now", 3.0)
    hook.close()
    data = (out / "events/000000000000/000000000000_worker_0.tfevents").read_bytes()
    events = [codec.decode_event(payload) for _, payload in codec.iter_records(data)]
    times = {v.tag: e.wall_time for e in events for v in e.values}
    assert times["scalar/given"] == 1234567890.5
    assert abs(times["scalar/now"] - time.time()) < 60
    with pytest.raises(SMDebugTypeError, match="timestamp"):
        BaseHook(out_dir=str(tmp_path / "other")).save_scalar("x", 1.0, timestamp="yesterday")


def test_a_hook_that_saved_nothing_still_leaves_a_run(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out, include_collections=["losses"], save_config=every_step())
    for _ in range(3):  # training, but no loss was ever registered: nothing is due to be saved
        hook.begin_step()
        assert not hook.save_for_step("fc.weight", np.ones(2))
        hook.end_step()
    hook.close()
    trial = create_trial(out)
    assert trial.steps() == [] and trial.training_ended()
    assert "losses" in trial.collections()


def test_dry_run_writes_nothing(tmp_path):
    out = tmp_path / "run"
    hook = BaseHook(out_dir=str(out), dry_run=True, save_all=True)
    hook.begin_step()
    hook.save_tensor("t", np.ones(3))
    hook.close()
    assert not out.exists()


def test_include_regex_and_save_all(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out, include_regex=["relu.*"], save_config=every_step())
    hook.begin_step()
    hook.save_for_step("relu1_output_0", np.ones(2))
    hook.save_for_step("conv_output_0", np.ones(2))
    hook.close()
    assert create_trial(out).tensor_names() == ["relu1_output_0"]
    out2 = str(tmp_path / "run2")
    hook = BaseHook(out_dir=out2, save_all=True, save_config=every_step())
    hook.begin_step()
    hook.save_for_step("anything", np.ones(2))
    hook.close()
    assert create_trial(out2).tensor_names(collection="all") == ["anything"]


def test_workers(tmp_path):
    out = str(tmp_path / "run")

    def make(rank, include_workers):
        class Hook(BaseHook):
            def worker_name(self):
                return f"worker_{rank}"

            def num_workers(self):
                return 2

        hook = Hook(out_dir=out, save_config=every_step(), include_workers=include_workers, save_all=True)
        return hook

    hooks = [make(0, "all"), make(1, "all")]
    for step in range(3):
        for rank, hook in enumerate(hooks):
            hook.begin_step()
            hook.save_for_step("w", np.full(2, rank * 10 + step))
    for hook in hooks:
        hook.close()
    trial = create_trial(out)
    assert trial.workers() == ["worker_0", "worker_1"]
    assert trial.num_workers == 2
    t = trial.tensor("w")
    assert t.value(2, worker="worker_1").tolist() == [12, 12]
    assert t.value(2, worker="worker_0").tolist() == [2, 2]
    assert t.workers(1) == ["worker_0", "worker_1"]
    with pytest.raises(InvalidWorker):
        t.value(0, worker="worker_7")


def test_include_workers_one_saves_only_the_chief(tmp_path):
    out = str(tmp_path / "run")

    class Hook(BaseHook):
        def worker_name(self):
            return "worker_1"

    hook = Hook(out_dir=out, save_all=True)
    hook.begin_step()
    hook.save_for_step("w", np.ones(1))
    hook.close()
    assert not os.path.exists(out)


def test_memory_uri(tmp_path):
    hook = BaseHook(out_dir="memory://smdebug-test/run1", save_all=True, save_config=every_step())
    for i in range(3):
        hook.begin_step()
        hook.save_for_step("w", np.full(2, i))
    hook.close()
    trial = create_trial("memory://smdebug-test/run1")
    assert trial.steps() == [0, 1, 2]
    assert trial.tensor("w").value(2).tolist() == [2, 2]


def test_finished_run_is_refused(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out)
    hook.begin_step()
    hook.save_tensor("t", np.ones(1))
    hook.close()
    with pytest.raises(ConfigError, match="already holds a finished smdebug run"):
        BaseHook(out_dir=out)


def test_bad_arguments_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="include_workers"):
        BaseHook(out_dir=str(tmp_path), include_workers="some")
    with pytest.raises(ConfigError, match="out_dir"):
        BaseHook(out_dir=None)
    with pytest.raises(ConfigError, match="reduction_config"):
        BaseHook(out_dir=str(tmp_path), reduction_config={"reductions": ["mean"]})


def test_unknown_tensor(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out)
    hook.begin_step()
    hook.save_tensor("t", np.ones(1))
    hook.close()
    with pytest.raises(TensorUnavailable):
        create_trial(out).tensor("nope")


def test_create_trial_needs_a_path():
    with pytest.raises(ValueError, match="create_trial needs the path"):
        create_trial()


def test_queue_bound_blocks_without_dropping(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out, save_all=True, save_config=every_step(), max_queue_bytes=4096)
    big = np.arange(2048, dtype=np.float32)  # 8 KiB, twice the bound: admitted alone into an empty queue
    for i in range(20):
        hook.begin_step()
        hook.save_for_step("big", big + i)
        hook.save_for_step("small", np.full(8, i))
    hook.close()
    trial = create_trial(out)
    assert trial.steps() == list(range(20))
    assert trial.tensor("big").value(19)[0] == 19
    assert trial.tensor("small").value(7).tolist() == [7] * 8


def test_save_failure_never_reaches_training(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    hook = BaseHook(out_dir=str(blocker / "run"), save_all=True, save_config=every_step())
    for _ in range(3):
        hook.begin_step()
        hook.save_for_step("w", np.ones(2))
    hook.close()
    messages = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("could not save step 0" in m for m in messages)
    assert any("3 step(s) could not be saved" in m and "0, 1, 2 (" in m for m in messages)


@pytest.mark.parametrize("uri", ["local", "memory://smdebug-test/late"])
def test_values_saved_after_a_step_ended_join_it_without_losing_its_tensors(tmp_path, uri):
    out = str(tmp_path / "run") if uri == "local" else uri
    hook = BaseHook(out_dir=out, save_all=True, save_config=every_step())
    for i in range(2):
        hook.begin_step()
        hook.save_for_step("w", np.full(2, float(i)))
        hook.end_step()
    hook.save_scalar("after", 5.0)  # outside a step: it goes to the last step, step 1
    hook.save_tensor("late", np.arange(3))
    hook.close()
    trial = create_trial(out)
    assert trial.steps() == [0, 1]
    assert trial.tensor("w").steps() == [0, 1]
    assert trial.tensor("w").value(1).tolist() == [1.0, 1.0]
    assert trial.tensor("scalar/after").value(1).tolist() == [5.0]  # a Python float: shape (1,), as smdebug
    assert trial.tensor("late").value(1).tolist() == [0, 1, 2]


def test_an_empty_tensor_keeps_its_raw_value_and_skips_reductions_with_one_warning(tmp_path, caplog):
    out = str(tmp_path / "run")
    rc = smdebug.ReductionConfig(reductions=["mean", "max"], save_raw_tensor=True)
    hook = BaseHook(out_dir=out, include_regex=["^e$"], reduction_config=rc, save_config=every_step())
    for _ in range(2):
        hook.begin_step()
        assert hook.save_for_step("e", np.zeros((0, 3), dtype=np.float32))
        hook.end_step()
    hook.close()
    tensor = create_trial(out).tensor("e")
    assert tensor.steps() == [0, 1] and tensor.value(1).shape == (0, 3)
    assert [r.getMessage() for r in caplog.records if "no reductions of e" in r.getMessage()] == [
        "smdebug: no reductions of e: cannot compute mean of an empty tensor"
    ]


@pytest.mark.parametrize("observed", [True, False], ids=["tensors-observed", "no-observer"])
def test_a_value_no_event_file_can_hold_is_recorded_unsaved_when_saved_not_lost_in_the_writer(
    tmp_path, caplog, monkeypatch, observed
):
    """An int past 64 bits (an object array) or float128: the writer found it only while encoding, and
    dropped it with a warning at every step and no record in the run. Without a plugin observing saved
    tensors (smdebug-dummy observes them), a numpy value goes to the writer as a view: checked there too."""
    if not observed:
        monkeypatch.setenv("SMDEBUG_DISABLE_PLUGINS", "dummy")
        plugins.reset()
    caplog.set_level(logging.WARNING, logger="smdebug")
    hook = BaseHook(out_dir=str(tmp_path / "run"), save_config=smdebug.SaveConfig(save_interval=1))
    for _ in range(3):
        hook.begin_step()
        hook.save_tensor("huge", np.array([2**80]))
        hook.save_tensor("fine", np.ones(2))
        hook.end_step()
    with pytest.raises(SMDebugTypeError, match="an int within 64 bits"):
        hook.save_scalar("huge", 2**80)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("fine").steps() == [0, 1, 2]
    assert "huge" in trial.unsaved_tensors()["worker_0"]
    assert len([r for r in caplog.records if "huge" in r.getMessage()]) == 1  # warned once, not a step
    assert not any("could not encode" in r.getMessage() for r in caplog.records)
