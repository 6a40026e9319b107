"""The built-in rules' documented semantics (reference/builtin-rules.md) on small runs whose tensors are
chosen value by value: which steps fire, with string parameters as configurations give them."""

import numpy as np
import pytest

import smdebug
from smdebug.exceptions import SMDebugValueError
from smdebug.rules import create_rule, evaluate_rule
from smdebug.trials import create_trial


def write_run(out, steps, collection="default"):
    """``steps``: a list of (mode, {name: value}) saved in ``collection`` at global steps 0, 1, ..."""
    hook = smdebug.BaseHook(
        out_dir=out, include_collections=[collection], save_config=smdebug.SaveConfig(save_interval=1)
    )
    for mode, tensors in steps:
        hook.set_mode(mode)
        hook.begin_step()
        for name, value in tensors.items():
            hook.save_tensor(name, np.asarray(value, dtype=np.float32), collections_to_write=collection)
        hook.end_step()
    hook.close()
    return create_trial(out)


def fired(trial, name, **params):
    return evaluate_rule(create_rule(name, trial, **params))


def test_saturated_activation_takes_the_earlier_docs_range_pairs(tmp_path):
    # tanh inputs in (2, 3): inside the default (-9.4999, 9.4999), all outside a (-1, 1) range
    tanh_in = np.linspace(2, 3, 32).reshape(4, 8)
    trial = write_run(str(tmp_path / "run"), [(smdebug.modes.TRAIN, {"Net_tanh_input_0": tanh_in})] * 2)
    assert fired(trial, "saturated_activation") == []
    assert fired(trial, "saturated_activation", threshold_tanh="(-1, 1)") == [0, 1]
    assert fired(trial, "saturated_activation", threshold_tanh=(-1.0, 1.0)) == [0, 1]
    assert fired(trial, "saturated_activation", threshold_tanh_min="-1", threshold_tanh_max="1") == [0, 1]
    with pytest.raises(SMDebugValueError, match="threshold_tanh='1, -1' is not a \\(low, high\\) pair"):
        create_rule("saturated_activation", trial, threshold_tanh="1, -1")


def test_confusion_fills_in_defaults_for_parameters_left_out(tmp_path):
    # labels 0..9, class 4 predicted as 7: column 7 holds one right and one wrong prediction
    labels = np.arange(10)
    predictions = labels.copy()
    predictions[4] = 7
    trial = write_run(str(tmp_path / "run"), [(smdebug.modes.TRAIN, {"foo": labels, "bar": predictions})])
    rule = create_rule(
        "confusion",
        trial,
        category_no=None,
        labels="foo",
        predictions="bar",
        min_diag=None,
        max_off_diag=None,
    )
    assert (rule.min_diag, rule.max_off_diag) == (0.9, 0.1)
    assert evaluate_rule(rule) == [0]
    # positional, as an old smdebug test calls it: category_no, labels, predictions
    assert (
        evaluate_rule(smdebug.rules.Confusion(trial, "10", "foo", "bar", min_diag="0.0", max_off_diag="0.6"))
        == []
    )


def test_similar_across_runs_compares_tensors_saved_as_reductions_only(tmp_path):
    def reductions_run(name, scale):
        out = str(tmp_path / name)
        hook = smdebug.BaseHook(
            out_dir=out,
            include_collections=["gradients"],
            save_config=smdebug.SaveConfig(save_interval=1),
            reduction_config=smdebug.ReductionConfig(reductions=["mean"], abs_reductions=["max"]),
        )
        hook.get_collection("gradients").include("^gradient")
        for step in range(3):
            hook.begin_step()
            hook.save_for_step("gradient/fc.weight", np.full((2, 2), (step + 1) * scale, dtype=np.float32))
            hook.end_step()
        hook.close()
        return out

    base, same, other = reductions_run("base", 1.0), reductions_run("same", 1.0), reductions_run("other", 2.0)
    assert create_trial(base).tensor("gradient/fc.weight").reduction_values(0)  # no value, reductions only
    assert fired(create_trial(same), "similar_across_runs", other_trial=base) == []
    assert fired(create_trial(other), "similar_across_runs", other_trial=base) == [0, 1, 2]


def test_tensor_variance_reads_a_saved_variance_when_only_reductions_were_saved(tmp_path):
    out = str(tmp_path / "run")
    hook = smdebug.BaseHook(
        out_dir=out,
        include_collections=["weights"],
        save_config=smdebug.SaveConfig(save_interval=1),
        reduction_config=smdebug.ReductionConfig(reductions=["variance", "mean"]),
    )
    hook.get_collection("weights").include("weight")
    for spread in (1.0, 100.0):  # variances 1 and 10000
        hook.begin_step()
        hook.save_for_step("fc.weight", np.array([-spread, spread], dtype=np.float32))
        hook.end_step()
    hook.close()
    trial = create_trial(out)
    assert fired(trial, "tensor_variance", collection_names="weights", max_threshold="10") == [1]
    assert fired(trial, "tensor_variance", collection_names="weights", min_threshold="10") == [0]


def test_all_zero_on_a_tensor_saved_as_reductions_only(tmp_path):
    out = str(tmp_path / "run")
    hook = smdebug.BaseHook(
        out_dir=out,
        include_collections=["biases"],
        save_config=smdebug.SaveConfig(save_interval=1),
        reduction_config=smdebug.ReductionConfig(abs_reductions=["max"]),
    )
    hook.get_collection("biases").include("bias")
    for value in (0.0, 0.5):  # all zeros, then not
        hook.begin_step()
        hook.save_for_step("fc.bias", np.full(4, value, dtype=np.float32))
        hook.end_step()
    hook.close()
    trial = create_trial(out)
    assert fired(trial, "all_zero", collection_names="biases") == [0]
    # a share of zeros below 100% needs the values: no verdict from the reductions
    assert fired(trial, "all_zero", collection_names="biases", threshold="50") == [0]
