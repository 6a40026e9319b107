"""The Trial API as smdebug 1.0 behaves: create_trial's arguments, live refresh on query, and the edges of
collection(), tensor_names(), mode(), global_step(), value() and prev_steps().

Runs are written by the core's own writer (no framework), so these tests hold whatever hook is in use.
"""

import json

import numpy as np
import pytest

from smdebug import layout
from smdebug.analysis.utils import no_refresh, refresh
from smdebug.collection import Collection, CollectionManager
from smdebug.exceptions import NoMoreData, StepUnavailable, TensorUnavailableForStep
from smdebug.modes import ModeKeys
from smdebug.store import Store
from smdebug.trials import LocalTrial, S3Trial, StepState, Trial, create_trial
from smdebug.writing import RunWriter


class Run:
    """A run written step by step with RunWriter, its collections file and (at ``end()``) its end marker."""

    def __init__(self, path, worker="worker_0", num_workers=1):
        self.path = str(path)
        self.store = Store(self.path)
        self.writer = RunWriter(self.store, worker)
        manager = CollectionManager(
            {"weights": Collection("weights", include_regex=["w.*"])}, num_workers=num_workers
        )
        self.store.write_bytes(
            layout.collections_file_path(worker), json.dumps(manager.to_json_dict()).encode()
        )

    def step(self, step, mode=ModeKeys.TRAIN, mode_step=None, **tensors):
        for name, value in (tensors or {"w": np.full(2, step, np.float32)}).items():
            self.writer.write_tensor(
                step, mode, step if mode_step is None else mode_step, name, np.asarray(value)
            )
        self.writer.end_step(step)
        self.writer.flush()

    def end(self):
        self.writer.close()
        self.store.write_bytes(layout.END_OF_JOB_FILE, b"")


@pytest.fixture
def finished(tmp_path):
    run = Run(tmp_path / "run")
    for i in range(4):
        run.step(i * 2, ModeKeys.TRAIN, i)  # global steps 0 2 4 6 = TRAIN steps 0 1 2 3
    run.step(10, ModeKeys.EVAL, 0, w=np.ones(2), loss=np.float32(0.5))
    run.end()
    return run.path


# -- create_trial (item 6) ----------------------------------------------------------------------------------
def test_range_steps_restricts_the_trial(finished):
    trial = create_trial(finished, range_steps=(2, 6))
    assert trial.steps() == [2, 4]
    assert trial.tensor("w").steps() == [2, 4]
    assert create_trial(finished, range_steps=(4, None)).steps() == [4, 6, 10]
    assert create_trial(finished, "named", (None, 3)).steps() == [0, 2]


@pytest.mark.parametrize("bad", [(5, 2), (3, 3), (-1, 4), ("a", 3), (1, 2, 3), 7])
def test_bad_range_steps_is_one_clear_error(finished, bad):
    with pytest.raises(ValueError, match="range_steps"):
        create_trial(finished, range_steps=bad)


def test_unknown_keyword_is_a_type_error(finished):
    with pytest.raises(TypeError, match="rnage_steps"):
        create_trial(finished, rnage_steps=(0, 2))
    # smdebug 1.0's own options are accepted
    assert create_trial(finished, parallel=False, check=False, index_mode=True, cache=False).steps()
    assert create_trial(finished, profiler=False, output_dir="/opt/ml/processing/outputs/").steps()
    with pytest.raises(NotImplementedError, match="profiler trials are not part of this library"):
        create_trial(finished, profiler=True)


def test_local_and_s3_trial_names(finished):
    trial = create_trial(finished)
    assert isinstance(trial, LocalTrial) and isinstance(trial, Trial)
    assert LocalTrial("mine", finished).steps() == trial.steps()
    assert LocalTrial("mine", finished).name == "mine"
    assert issubclass(S3Trial, Trial)
    assert S3Trial.__init__.__code__.co_varnames[1:4] == ("name", "bucket_name", "prefix_name")


# -- live refresh on query (item 7) -------------------------------------------------------------------------
def test_a_step_written_right_after_a_query_is_seen_by_the_next_query(tmp_path):
    run = Run(tmp_path / "live")
    run.step(0)
    trial = create_trial(run.path)
    assert trial.steps() == [0]
    run.step(1)
    assert trial.steps() == [0, 1]  # at once, not after a refresh interval
    run.step(2, w=np.ones(1), extra=np.ones(1))
    assert "extra" in trial.tensor_names()
    run.step(3)
    assert trial.has_passed_step(3) == StepState.AVAILABLE
    run.step(4, w=np.full(2, 44.0))
    assert trial.tensor("w").value(4).tolist() == [44.0, 44.0]
    run.end()


def test_no_refresh_and_refresh_context_managers(tmp_path):
    run = Run(tmp_path / "live")
    run.step(0)
    trial = create_trial(run.path)
    with no_refresh([trial]) as trials:
        assert trials == [trial]
        run.step(1)
        assert trial.steps() == [0]
        with refresh(trial):
            assert trial.steps() == [0, 1]
        run.step(2)
        assert trial.steps() == [0, 1]  # no_refresh is back after the inner block
    assert trial.dynamic_refresh is True
    assert trial.steps() == [0, 1, 2]
    run.end()


# -- Trial and Tensor edges (item 8) ------------------------------------------------------------------------
def test_collection_not_saved_is_a_new_empty_collection(finished):
    trial = create_trial(finished)
    coll = trial.collection("gradients")
    assert isinstance(coll, Collection) and coll.name == "gradients"
    assert trial.tensor_names(collection="gradients") == []
    assert trial.collection("weights").name == "weights"


def test_collection_is_registered_in_the_trial(finished):
    """As smdebug 1.0: trial.collection(name) registers what it returns, so include() on it persists."""
    trial = create_trial(finished)
    custom = trial.collection("custom")
    assert trial.collection("custom") is custom and "custom" in trial.collections()
    custom.include("lo")
    assert trial.tensor_names(collection="custom") == ["loss"]
    trial.collection("custom").include("^w$")
    assert trial.tensor_names(collection="custom") == ["loss", "w"]
    # a saved collection given more patterns keeps them too
    trial.collection("weights").include("loss")
    assert trial.tensor_names(collection="weights") == ["loss", "w"]


def test_regex_and_collection_together_is_a_value_error(finished):
    trial = create_trial(finished)
    with pytest.raises(ValueError, match="regex or collection"):
        trial.tensor_names(regex="w", collection="weights")
    assert trial.tensor_names(regex="lo") == ["loss"]
    assert trial.tensor_names(collection="weights") == ["w"]


def test_mode_of_an_unsaved_step_is_none(finished):
    trial = create_trial(finished)
    assert trial.mode(1) is None
    assert trial.mode_step(1) is None
    assert trial.mode(10) == ModeKeys.EVAL and trial.mode_step(10) == 0


def test_global_step_of_global_mode_is_the_step(finished):
    trial = create_trial(finished)
    assert trial.global_step(ModeKeys.GLOBAL, 4) == 4
    assert trial.global_step("global", 10) == 10
    assert trial.global_step(ModeKeys.TRAIN, 3) == 6
    # a mode step not saved has no global step: None, as smdebug 1.0 returns (as mode() and mode_step() do)
    assert trial.global_step(ModeKeys.TRAIN, 9) is None
    assert trial.global_step(ModeKeys.PREDICT, 0) is None


def test_value_past_the_end_of_a_finished_run_is_step_unavailable(finished):
    tensor = create_trial(finished).tensor("w")
    with pytest.raises(StepUnavailable):
        tensor.value(50)
    with pytest.raises(StepUnavailable):
        tensor.value(3)  # skipped
    with pytest.raises(NoMoreData):  # waiting for a step past the end still says there is no more
        create_trial(finished).wait_for_steps([50])


def test_prev_steps_include_the_step_itself_and_give_up_to_n(finished):
    tensor = create_trial(finished).tensor("w")
    assert tensor.prev_steps(4, 2) == [2, 4]
    assert tensor.prev_steps(5, 2) == [2, 4]
    assert tensor.prev_steps(4, 10) == [0, 2, 4]
    assert tensor.prev_steps(0, 1) == [0]
    assert tensor.prev_steps(2, 1, mode=ModeKeys.TRAIN) == [2]


def test_last_index_token(tmp_path):
    run = Run(tmp_path / "live")
    trial = create_trial(run.path)
    assert trial.last_index_token is None
    run.step(0)
    run.step(5)
    trial.steps()
    assert trial.last_index_token.endswith(layout.index_file_path(5, "worker_0"))
    run.end()
    trial.steps()
    assert trial.last_index_token == f"{run.path}/{layout.index_file_path(5, 'worker_0')}"


def test_create_trial_takes_a_path_object_and_strips_spaces(finished):
    from pathlib import Path

    assert create_trial(Path(finished)).steps() == create_trial(f"  {finished} ").steps() == [0, 2, 4, 6, 10]


def test_steps_with_mode_none_are_the_steps_of_every_mode(finished):
    """smdebug 1.0's analysis documentation: ``trial.steps(mode=None)``, "if this is not passed, returns
    steps for all modes"; the tensor's and the other readers' mode arguments take None the same way."""
    trial = create_trial(finished)
    assert trial.steps(mode=None) == trial.steps() == [0, 2, 4, 6, 10]
    w = trial.tensor("w")
    assert w.steps(mode=None) == w.steps()
    assert w.value(4, mode=None).tolist() == [4.0, 4.0]  # global step 4
    assert trial.tensor_names(step=10, mode=None) == ["loss", "w"]
    assert trial.has_passed_step(6, mode=None) == StepState.AVAILABLE


def test_a_reduction_value_is_a_numpy_value_stored_or_computed(tmp_path):
    """reduction_value "returns numpy.ndarray ... as a 1x1 numpy array": ``.item()``, ``.shape`` and
    ``.dtype`` work whether the reduction was saved or is computed from the saved tensor."""
    run = Run(tmp_path / "run")
    run.writer.write_tensor(0, ModeKeys.TRAIN, 0, "smdebug/reductions/max/w", np.array(3.0, np.float32))
    run.step(0, w=np.array([1.0, -3.0], np.float32), v=np.array([1.0, -3.0], np.float32))
    run.end()
    trial = create_trial(run.path)
    stored = trial.tensor("w").reduction_value(0, "max")
    computed = trial.tensor("v").reduction_value(0, "max", abs=True)
    for value, expected in ((stored, 3.0), (computed, 3.0)):
        assert value.item() == expected and value.shape == () and value.dtype.kind == "f"
        assert f"{value:.1f}" == "3.0" and float(value) == expected


def test_a_finished_run_that_saved_nothing_is_missing_collection_files(tmp_path):
    """smdebug 1.0's analysis documentation: MissingCollectionFiles "is raised when no data was saved by
    the training job" (its end is marked, and no collections or index file was ever written)."""
    from smdebug.exceptions import MissingCollectionFiles

    empty = tmp_path / "ended"
    empty.mkdir()
    (empty / layout.END_OF_JOB_FILE).write_bytes(b"")
    with pytest.raises(MissingCollectionFiles):
        create_trial(str(empty))
    not_yet = tmp_path / "not_yet"  # a run not written yet (or still starting): a trial that waits for it
    assert create_trial(str(not_yet), missing_ok=True).steps() == []


def test_workers_of_a_step_the_tensor_was_not_saved_at_is_tensor_unavailable_for_step(finished):
    """smdebug 1.0's Tensor.workers raises TensorUnavailableForStep for every step the tensor lacks."""
    trial = create_trial(finished)
    assert trial.tensor("w").workers(2) == ["worker_0"]
    assert trial.tensor("w").workers(0, mode=ModeKeys.EVAL) == ["worker_0"]
    for step, mode in ((3, ModeKeys.GLOBAL), (50, ModeKeys.GLOBAL), (7, ModeKeys.TRAIN)):
        with pytest.raises(TensorUnavailableForStep):
            trial.tensor("w").workers(step, mode=mode)
    with pytest.raises(TensorUnavailableForStep):
        trial.tensor("loss").workers(2)  # a saved step without this tensor


def test_an_unknown_reduction_is_an_smdebug_value_error_naming_the_nearest(finished):
    """smdebug 1.0 raises SMDebugValueError (a ValueError) for a reduction it does not know."""
    from smdebug.exceptions import SMDebugValueError

    tensor = create_trial(finished).tensor("w")
    with pytest.raises(SMDebugValueError, match="unknown reduction 'meen'; did you mean 'mean'"):
        tensor.reduction_value(2, "meen")
    with pytest.raises(ValueError):
        tensor.reduction_value(2, "bogus", abs=True)
    assert tensor.reduction_value(2, "mean") == 2.0


def test_a_tensorflow_device_worker_is_named_as_its_device(tmp_path):
    """A MirroredStrategy replica's files hold its device as _job-localhost_replica-0_task-0_device-CPU-0
    (no / or : in file names); smdebug 1.0's Trial names the worker by the device itself, as its
    documentation of workers() says ("names of different devices in the process")."""
    devices = ["/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"]
    in_files = [d.replace("/", "_").replace(":", "-") for d in devices]
    runs = [Run(tmp_path / "run", worker=w, num_workers=2) for w in in_files]
    for i, run in enumerate(runs):
        loss = {"loss": np.float32(0.5)} if i == 0 else {}  # (Keras' loss: the first replica saves it)
        run.step(0, w=np.full(2, i, np.float32), **loss)
        run.step(1, w=np.full(2, 10 + i, np.float32), **loss)
    runs[0].end()
    runs[1].writer.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.workers() == devices
    assert trial.steps() == [0, 1]
    w = trial.tensor("w")
    assert w.workers(1) == devices
    assert w.value(1, worker=devices[1]).tolist() == [11.0, 11.0]
    assert w.value(1, worker=in_files[1]).tolist() == [11.0, 11.0]  # the file-name form is that worker too
    assert w.value(1).tolist() == [10.0, 10.0]  # the first worker
    assert (tmp_path / "run" / trial.last_index_token.split("/run/", 1)[1]).is_file()
    # TensorBoard export: the files are named in the file-name form; a worker's export leaves out the
    # tensors only another worker saved
    from smdebug.tensorboard import export_tensorboard

    for worker, logdir in ((None, "tb0"), (devices[1], "tb1"), (in_files[1], "tb2")):
        export_tensorboard(trial, tmp_path / logdir, worker=worker)
    assert [p.name for p in (tmp_path / "tb0" / "TRAIN").iterdir()] == [
        f"000000000000_{in_files[0]}.tfevents"
    ]
    for logdir in ("tb1", "tb2"):
        assert [p.name for p in (tmp_path / logdir / "TRAIN").iterdir()] == [
            f"000000000000_{in_files[1]}.tfevents"
        ]


def test_a_step_only_some_workers_have_written_yet_reads_theirs(tmp_path):
    """A live run of two workers, worker_1 behind: step 1 is not complete (steps() leaves it out, as
    smdebug 1.0), but what worker_0 saved of it reads, and workers(1) names worker_0, as smdebug 1.0
    does; worker_1's value is not yet available (StepNotYetAvailable), a worker the run has not is
    InvalidWorker."""
    from smdebug.exceptions import InvalidWorker, StepNotYetAvailable

    runs = [Run(tmp_path / "run", worker=f"worker_{i}", num_workers=2) for i in range(2)]
    for i, run in enumerate(runs):
        run.step(0, w=np.full(2, i, np.float32))
    runs[0].step(1, w=np.full(2, 10, np.float32))
    trial = create_trial(str(tmp_path / "run"))
    w = trial.tensor("w")
    assert trial.steps() == [0] and w.steps() == [0]
    assert trial.steps(show_incomplete_steps=True) == [0, 1] and w.steps(show_incomplete_steps=True) == [0, 1]
    assert trial.has_passed_step(1) == StepState.NOT_YET_AVAILABLE
    assert w.workers(1) == ["worker_0"]
    assert w.value(1).tolist() == [10.0, 10.0]
    assert w.value(1, worker="worker_0").tolist() == [10.0, 10.0]
    assert w.value(1, mode=ModeKeys.TRAIN).tolist() == [10.0, 10.0]
    with pytest.raises(StepNotYetAvailable):
        w.value(1, worker="worker_1")
    with pytest.raises(InvalidWorker):
        w.value(1, worker="worker_7")
    with pytest.raises(StepNotYetAvailable):
        w.value(2)
    runs[1].step(1, w=np.full(2, 11, np.float32))  # worker_1 catches up: the step is complete
    assert trial.steps() == [0, 1] and w.workers(1) == ["worker_0", "worker_1"]
    assert w.value(1, worker="worker_1").tolist() == [11.0, 11.0]


def test_shapes_by_step_and_a_shape_never_saved_is_tensor_unavailable_for_step(tmp_path):
    """smdebug's analysis documentation: ``shapes(mode, worker)`` gives every step's shape
    (``dict[int -> tuple(int)]``), and ``shape(step)`` raises TensorUnavailableForStep when neither the shape
    nor the value was saved (smdebug 1.0.34's ShapeUnavailableForStep, which therefore is one)."""
    from smdebug.exceptions import InvalidWorker, ShapeUnavailableForStep

    run = Run(tmp_path / "run")
    run.step(0, w=np.zeros((2, 3), np.float32))
    run.step(1, ModeKeys.EVAL, 0, w=np.zeros(4, np.float32))
    run.writer.write_tensor(2, ModeKeys.TRAIN, 1, "smdebug/reductions/max/v", np.array(3.0, np.float32))
    run.step(2, w=np.zeros((5,), np.float32))
    run.end()
    trial = create_trial(run.path)
    w = trial.tensor("w")
    assert w.shapes() == {0: (2, 3), 1: (4,), 2: (5,)}
    assert w.shapes(mode=ModeKeys.TRAIN) == {0: (2, 3), 1: (5,)}
    assert w.shapes(mode=ModeKeys.EVAL, worker="worker_0") == {0: (4,)}
    with pytest.raises(InvalidWorker):
        w.shapes(worker="worker_3")
    with pytest.raises(TensorUnavailableForStep) as caught:
        trial.tensor("v").shape(2)  # reductions only, no shape
    assert isinstance(caught.value, ShapeUnavailableForStep) and caught.value.step == 2
    assert str(caught.value) == "Shape for tensor v is not available for step 2 with mode GLOBAL"


def test_values_of_a_worker_are_the_steps_it_saved(tmp_path):
    """``values(worker=...)`` and ``shapes(worker=...)`` give what that worker saved, by step (the
    documentation's "value of the tensor from a specific worker"): a finished run whose worker_1 saved
    fewer steps gave InvalidWorker for worker_1, as smdebug 1.0.34 does."""
    runs = [Run(tmp_path / "run", worker=f"worker_{i}", num_workers=2) for i in range(2)]
    for step in range(3):
        for i, run in enumerate(runs):
            if i == 0 or step < 2:
                run.step(step, w=np.full(2, 10 * i + step, np.float32))
    runs[1].writer.close()
    runs[0].end()
    w = create_trial(str(tmp_path / "run")).tensor("w")
    assert w.steps() == [0, 1, 2]
    assert {s: v.tolist() for s, v in w.values(worker="worker_1").items()} == {0: [10, 10], 1: [11, 11]}
    assert sorted(w.values(worker="worker_0")) == [0, 1, 2] and sorted(w.values()) == [0, 1, 2]
    assert w.shapes(worker="worker_1") == {0: (2,), 1: (2,)}
