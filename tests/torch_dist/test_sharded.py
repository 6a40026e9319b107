"""Sharded training on 2 real gloo CPU ranks (torch.multiprocessing, 127.0.0.1): FSDP2 (fully_shard) and
tensor parallel runs against the same model trained unsharded in this process (same initial weights, same
global batch); DDP with gradient_as_bucket_view=True. All scenarios run in one 2-rank job (one start-up)."""

import json
import os
import socket

import numpy as np
import pytest
import sharded_worker
import torch
import torch.multiprocessing as mp
from sharded_models import ABS_REDUCTIONS, NORMS, REDUCTIONS, STEPS, reference_run, train_accumulating
from support import smdebug_cli

import smdebug.pytorch as smd
from smdebug.reductions import numpy_reduction

torch.set_num_threads(1)

PAIRS = [(r, False) for r in [*REDUCTIONS, *NORMS]] + [(r, True) for r in [*ABS_REDUCTIONS, *NORMS]]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("sharded"))
    mp.spawn(sharded_worker.main, args=(_free_port(), base, list(sharded_worker.SCENARIOS)), nprocs=2)
    for kind in ("mlp", "block", "tp"):
        reference_run(kind, os.path.join(base, f"reference_{kind}"))
    for kind in ("mlp", "tp"):
        reference_run(kind, os.path.join(base, f"reference_{kind}_accumulating"), train_accumulating)
    return base


def _trials(runs, scenario, kind):
    return smd.create_trial(os.path.join(runs, scenario)), smd.create_trial(
        os.path.join(runs, f"reference_{kind}")
    )


def _parameters(trial):
    return trial.tensor_names(regex="weight|bias")


def _check_against_reference(trial, reference, rtol=1e-4, atol=1e-6, steps=STEPS):
    assert trial.tensor_names() == reference.tensor_names()  # the user's names, not FSDP<Name>
    names = _parameters(reference)
    assert any(n.startswith("gradient/") for n in names) and len(names) >= 8
    for name in names:
        assert trial.tensor(name).steps() == list(range(steps)), name
        for step in range(steps):
            full = trial.tensor(name).value(step)
            np.testing.assert_allclose(
                full, reference.tensor(name).value(step), rtol=rtol, atol=atol, err_msg=f"{name} {step}"
            )
            for reduction, absolute in PAIRS:
                expected = numpy_reduction(full, reduction, absolute)
                got = trial.tensor(name).reduction_value(step, reduction, abs=absolute)
                np.testing.assert_allclose(
                    got, expected, rtol=1e-5, atol=1e-6, err_msg=f"{name} {step} {reduction} abs={absolute}"
                )


@pytest.mark.parametrize(
    "scenario, kind",
    [("fsdp_mlp", "mlp"), ("fsdp_mlp_after", "mlp"), ("fsdp_block", "block"), ("tp_mlp", "tp")],
)
def test_sharded_runs_equal_the_unsharded_run(runs, scenario, kind):
    trial, reference = _trials(runs, scenario, kind)
    assert trial.workers() == ["worker_0", "worker_1"]
    _check_against_reference(trial, reference)


@pytest.mark.parametrize("scenario, kind", [("fsdp_accumulating", "mlp"), ("tp_accumulating", "tp")])
def test_a_pass_of_gradient_accumulation_saves_its_own_sharded_gradient(runs, scenario, kind):
    """As for an unsharded model: what each backward pass adds, not the sum in param.grad so far."""
    trial = smd.create_trial(os.path.join(runs, scenario))
    reference = smd.create_trial(os.path.join(runs, f"reference_{kind}_accumulating"))
    _check_against_reference(trial, reference, steps=2 * STEPS)


def test_smdebug_diff_of_a_sharded_run_and_the_unsharded_one_agrees(runs):
    """diff compares a sharded tensor whole (not worker_0's shard with the full tensor: 'shapes differ')."""
    from smdebug.trials import diff

    for scenario, kind in (("fsdp_mlp", "mlp"), ("tp_mlp", "tp")):
        df = diff(
            os.path.join(runs, scenario),
            os.path.join(runs, f"reference_{kind}"),
            rtol=1e-4,
            atol=1e-6,
            regex="weight|bias",
        )
        assert len(df) >= 8 and set(df["status"]) == {"agrees"}, df.to_string()


def test_each_rank_saves_its_shard_with_its_placement(runs):
    trial, reference = _trials(runs, "fsdp_mlp", "mlp")
    name = "MLP_fc1.weight"  # 5 rows on 2 ranks: 3 and 2
    shard0, shard1 = (trial.tensor(name).value(1, worker=w) for w in ("worker_0", "worker_1"))
    assert shard0.shape == (3, 6) and shard1.shape == (2, 6)
    np.testing.assert_allclose(np.concatenate([shard0, shard1]), reference.tensor(name).value(1), rtol=1e-5)
    placements = trial.placements(name)
    assert placements["worker_1"]["offsets"] == [3, 0]
    assert placements["worker_1"]["global_shape"] == [5, 6]
    assert trial.tensor(name).shape(1) == (5, 6)
    # the stored reductions are the full tensor's, whichever worker is asked
    full_l2 = np.linalg.norm(reference.tensor(name).value(1))
    for worker in ("worker_0", "worker_1"):
        assert trial.tensor(name).reduction_value(1, "l2", worker=worker) == pytest.approx(full_l2, rel=1e-5)


def test_a_hook_registered_first_follows_a_submodule_sharded_later(runs):
    """fully_shard(model.fc1) only: the root keeps its class, fc1's parameters are replaced unseen."""
    out_dir = os.path.join(runs, "fsdp_mlp_part")
    trial, reference = _trials(runs, "fsdp_mlp_part", "mlp")
    assert trial.tensor_names() == reference.tensor_names()
    assert trial.placements("MLP_fc1.weight")["worker_1"]["offsets"] == [3, 0]
    with open(f"{out_dir}.expected.json") as f:
        expected = json.load(f)
    for step, tensors in enumerate(expected):
        for name, value in tensors.items():
            np.testing.assert_allclose(
                trial.tensor(name).value(step), value, rtol=1e-5, err_msg=f"{name} {step}"
            )


def test_health_on_a_model_sharded_after_its_first_step_keeps_saving_its_gradients(runs):
    """health noticed the sharded parameters first (on an idle step): step 3 still saves their gradients."""
    trial = smd.create_trial(os.path.join(runs, "fsdp_health_sharded_later"))
    grads = trial.tensor_names(collection="gradients")
    assert len(grads) == 4, grads
    for name in grads:
        assert trial.tensor(name).steps() == [0, 3], name
        assert trial.placements(name)["worker_1"]["local_shape"], name  # saved as shards at step 3
    assert trial.first_nonfinite() is None


def test_a_health_trigger_records_the_sharded_tensors_it_does_not_save(runs):
    """A trigger may fire on one rank alone, and a sharded tensor's capture needs every rank: those the
    collections name are recorded as not saved at the trigger's step, not silently left out."""
    trial = smd.create_trial(os.path.join(runs, "fsdp_health_trigger"))
    assert trial.first_nonfinite()["step"] == 2  # (FSDP2 gathers the weight: both ranks see the inf)
    for worker in ("worker_0", "worker_1"):
        unsaved = trial.unsaved_tensors()[worker]
        for name in ("MLP_fc1.weight", "gradient/MLP_fc1.weight"):
            assert "health trigger" in unsaved[name]["reason"], unsaved
            assert trial.tensor(name).steps() == [0]  # the save step's


def test_tensor_parallel_shards_and_gathered_values(runs):
    trial, reference = _trials(runs, "tp_mlp", "tp")
    # ColwiseParallel shards fc1's rows, RowwiseParallel fc2's columns; fc2's bias is replicated
    assert trial.tensor("MLP_fc1.weight").value(0, worker="worker_1").shape == (4, 6)
    assert trial.tensor("MLP_fc2.weight").value(0, worker="worker_1").shape == (3, 4)
    assert trial.placements("MLP_fc2.weight")["worker_1"]["offsets"] == [0, 4]
    assert trial.placements("MLP_fc2.bias")["worker_1"]["placements"] == ["Replicate()"]
    gathered = smd.create_trial(os.path.join(runs, "tp_mlp_gathered"))
    for name in _parameters(reference):
        for worker in ("worker_0", "worker_1"):  # each writing rank saved the whole tensor
            np.testing.assert_allclose(
                gathered.tensor(name).value(2, worker=worker),
                reference.tensor(name).value(2),
                rtol=1e-4,
                atol=1e-6,
            )
        assert gathered.placements(name) == {}
    # gathered: the exact median is saved as a reduction
    assert gathered.tensor("MLP_fc1.weight").reduction_value(2, "median") == pytest.approx(
        np.median(reference.tensor("MLP_fc1.weight").value(2)), rel=1e-5
    )


def test_a_dtensor_module_output_is_recorded_as_unsaved_and_the_rest_of_the_step_is_saved(runs):
    """fc1's output is a DTensor (use_local_output=False): not captured, recorded in the run; fc2's plain
    output keeps its value and reductions at every step (they were lost with it)."""
    trial = smd.create_trial(os.path.join(runs, "tp_dtensor_outputs"))
    for worker in ("worker_0", "worker_1"):
        assert trial.unsaved_tensors()[worker]["fc1_output_0"]["step"] == 0
        # the reason names the DTensor (it was torch's bare ".numpy() is not supported for tensor subclasses")
        assert "cannot convert a DTensor" in trial.unsaved_tensors()[worker]["fc1_output_0"]["reason"]
    assert "fc1_output_0" not in trial.tensor_names()
    out = trial.tensor("fc2_output_0")
    assert out.steps() == list(range(STEPS))
    for step in range(STEPS):
        stored = out.reduction_values(step, worker="worker_1")  # (saved ones, not computed by the Trial)
        assert stored[("max", False)] == pytest.approx(out.value(step, worker="worker_1").max(), rel=1e-6)
    assert trial.tensor("gradient/MLP_fc1.weight").steps() == list(range(STEPS))


def test_save_tensor_of_a_dtensor_saves_it_as_sharded_parameters_are(runs):
    """It was recorded unsaved ("cannot convert a DTensor"): now each rank's shard with its placement,
    the Trial assembling the full tensor, and the full tensor's reductions."""
    out_dir = os.path.join(runs, "tp_save_tensor")
    trial = smd.create_trial(out_dir)
    with open(f"{out_dir}.expected.json") as f:
        expected = [[np.array(v, dtype=np.float32) for v in values] for values in json.load(f)]
    assert trial.unsaved_tensors() in ({}, {"worker_0": {}, "worker_1": {}})
    raw, stats = trial.tensor("double_fc1_weight"), trial.tensor("double_fc1_weight_stats")
    replicated = trial.tensor("double_fc2_bias_stats")
    assert raw.steps() == stats.steps() == replicated.steps() == list(range(STEPS))
    for step, (full, bias) in enumerate(expected):
        np.testing.assert_allclose(raw.value(step), full, rtol=1e-6)
        assert raw.value(step, worker="worker_1").shape == (full.shape[0] // 2, full.shape[1])  # a shard
        for reduction, absolute in [("max", False), ("mean", False), ("l2", False)]:
            got = stats.reduction_values(step, worker="worker_0")[(reduction, absolute)]
            assert got == pytest.approx(numpy_reduction(full, reduction, absolute), rel=1e-5), reduction
        # a shard's median has no partial form (not stored); a replicated tensor's is exact on each rank
        assert ("median", False) not in stats.reduction_values(step, worker="worker_0")
        for worker in ("worker_0", "worker_1"):
            got = replicated.reduction_values(step, worker=worker)
            assert got[("median", False)] == pytest.approx(np.median(bias), rel=1e-6)
            assert got[("max", False)] == pytest.approx(bias.max(), rel=1e-6)
    assert "double_fc1_weight" in trial.tensor_names(collection="default")


def test_include_workers_one_saves_full_tensors_with_correct_reductions(runs):
    trial, reference = _trials(runs, "fsdp_mlp_one", "mlp")
    assert trial.workers() == ["worker_0"]
    _check_against_reference(trial, reference)


def test_ddp_gradient_as_bucket_view_saves_each_ranks_own_gradient(runs):
    out_dir = os.path.join(runs, "ddp_bucket_view")
    trial = smd.create_trial(out_dir)
    assert trial.steps() == list(range(sharded_worker.DDP_STEPS))
    for rank in range(2):
        with open(f"{out_dir}.expected_{rank}.json") as f:
            expected = json.load(f)
        for step, grads in enumerate(expected):
            for param, grad in grads.items():
                saved = trial.tensor(f"gradient/MLP_{param}").value(step, worker=f"worker_{rank}")
                np.testing.assert_allclose(
                    saved, grad, rtol=1e-5, atol=1e-7, err_msg=f"rank {rank} step {step}"
                )
    # the ranks' own gradients differ (each saw its own data): not the averaged one
    g = "gradient/MLP_fc2.bias"
    assert not np.allclose(
        trial.tensor(g).value(3, worker="worker_0"), trial.tensor(g).value(3, worker="worker_1")
    )


def test_a_lazy_models_gradients_are_saved_from_step_0_on_every_rank(runs):
    out_dir = os.path.join(runs, "lazy_mlp")
    trial = smd.create_trial(out_dir)
    for rank in range(2):
        with open(f"{out_dir}.expected_{rank}.json") as f:
            expected = json.load(f)
        for param, grad in expected.items():
            name = f"gradient/Sequential_{param}"
            assert trial.tensor(name).steps() == list(range(STEPS)), name
            saved = trial.tensor(name).value(0, worker=f"worker_{rank}")
            np.testing.assert_allclose(saved, grad, rtol=1e-5, atol=1e-7, err_msg=f"rank {rank} {name}")


@pytest.mark.parametrize("scenario", ["classic_fsdp", "classic_fsdp_inner", "classic_fsdp_flat_inner"])
def test_classic_fsdp_trains_with_one_clear_warning(runs, scenario):
    """The one warning (no other: a rank's empty views of the parameters it holds no part of warned
    'cannot compute min of an empty tensor') names the mode; without use_orig_params, a model registered
    before it was wrapped got no warning at all."""
    out_dir = os.path.join(runs, scenario)
    flat = scenario == "classic_fsdp_flat_inner"
    for rank in range(2):
        with open(f"{out_dir}.warnings_{rank}.json") as f:
            seen = json.load(f)
        assert len(seen) == 1, seen
        assert "classic" in seen[0] and "fully_shard" in seen[0], seen
        assert f"use_orig_params={not flat}" in seen[0], seen
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1]
    if flat:  # the flat parameter's gradient: each rank's own, before FSDP reduces it
        (grad,) = trial.tensor_names(regex="_flat_param$")
        assert not trial.tensor_names(regex=r"fc1\.weight$")
        for rank in range(2):
            with open(f"{out_dir}.expected_{rank}.json") as f:
                expected = json.load(f)
            for step, value in enumerate(expected):
                saved = trial.tensor(grad).value(step, worker=f"worker_{rank}")
                np.testing.assert_allclose(saved, value, rtol=1e-5, atol=1e-7)
        return
    (weight,) = trial.tensor_names(regex=r"fc1\.weight$")
    assert trial.tensor(weight).steps() == [0, 1]
    for name in trial.tensor_names(regex="weight|bias"):  # only what a rank holds: no empty views
        for worker in trial.tensor(name).workers(0):
            assert trial.tensor(name).value(0, worker=worker).size > 0, (name, worker)


def test_the_median_of_a_sharded_tensor_is_the_full_tensors_whichever_worker_is_asked(runs):
    """The median is not stored for a shard (no exact partial form): the Trial computes it from the
    assembled tensor, for a given worker too, as every stored reduction of a sharded tensor is the full
    tensor's (it was the median of that worker's shard)."""
    trial, reference = _trials(runs, "fsdp_mlp", "mlp")
    for name in ("MLP_fc1.weight", "gradient/MLP_fc1.weight"):
        full = reference.tensor(name).value(1)
        for worker in (None, "worker_0", "worker_1"):
            for absolute in (False, True):
                expected = np.median(np.abs(full) if absolute else full)
                got = trial.tensor(name).reduction_value(1, "median", worker=worker, abs=absolute)
                assert got == pytest.approx(expected, rel=1e-5), (name, worker, absolute)


def test_health_on_a_tensor_parallel_model_does_not_hang_on_a_non_finite_value_of_one_rank(runs):
    """The run finished (the fixture's job did not hang) and names the step and the worker."""
    first = smd.create_trial(os.path.join(runs, "tp_health_nan")).first_nonfinite()
    assert (first["step"], first["worker"]) == (2, "worker_1"), first


def test_a_hook_on_rank_0_only_saves_its_shards_alone_and_training_goes_on(runs):
    """The job finished (the fixture's); rank 0 saved its shards with their placement every step, the
    full tensors' reductions are recorded as not saved (they need every rank)."""
    trial = smd.create_trial(os.path.join(runs, "fsdp_hook_on_rank_0"))
    assert trial.workers() == ["worker_0"]
    weight = trial.tensor("MLP_fc1.weight")
    assert weight.steps() == list(range(STEPS))
    assert weight.value(1, worker="worker_0").shape == (3, 6)  # rank 0's rows of 5
    assert trial.placements("MLP_fc1.weight")["worker_0"]["global_shape"] == [5, 6]
    assert weight.reduction_values(1, worker="worker_0") == {}
    assert "not every rank has a hook" in trial.unsaved_tensors()["worker_0"]["MLP_fc1.weight"]["reason"]
    assert trial.tensor("CrossEntropyLoss_output_0").steps() == list(range(STEPS))


def test_smdebug_show_of_a_sharded_tensor_says_it_shows_the_full_tensor(runs):
    """Without --worker the value shown is assembled from every shard: the heading said worker_0."""
    out = smdebug_cli("show", os.path.join(runs, "fsdp_mlp"), "MLP_fc1.weight", "--step", "1").stdout
    assert "the full tensor, from the shards of worker_0, worker_1" in out.splitlines()[0], out
    assert "shape: (5, 6)" in out
    out = smdebug_cli(
        "show", os.path.join(runs, "fsdp_mlp"), "MLP_fc1.weight", "--step", "1", "--worker", "worker_1"
    )
    assert "worker_1)" in out.stdout.splitlines()[0] and "shape: (2, 6)" in out.stdout, out.stdout


def test_ranks_that_find_another_rank_late_all_save_alone(runs):
    """Rank 0 gave up waiting for rank 1's hook; rank 1, finding rank 0's, saved alone as well (the
    job finished: the fixture's)."""
    trial = smd.create_trial(os.path.join(runs, "tp_rank_1_late"))
    assert trial.workers() == ["worker_0", "worker_1"]
    for worker in ("worker_0", "worker_1"):
        assert trial.tensor("Sequential_0.weight").value(1, worker=worker).shape == (4, 6)
        assert "not every rank has a hook" in trial.unsaved_tensors()[worker]["Sequential_0.weight"]["reason"]
