"""Many runs: a rule whose chosen tensors match nothing in a run is an error row, not "ok"."""

import numpy as np

import smdebug
from smdebug.hook import BaseHook
from smdebug.rules.sweep import evaluate_runs


def _write(out, steps=6):
    hook = BaseHook(
        out_dir=out, save_config=smdebug.SaveConfig(save_interval=1), include_collections=["weights"]
    )
    hook.get_collection("weights").include("^weight/")
    for step in range(steps):
        hook.begin_step()
        hook.save_for_step("weight/fc", np.full((2, 2), step + 1.0, dtype=np.float32))
        hook.end_step()
    hook.close()
    return out


def test_rule_that_checked_nothing_is_an_error_row(tmp_path):
    runs = [_write(str(tmp_path / "a")), _write(str(tmp_path / "b"))]
    rules = [("all_zero", {"tensor_regex": "wieght/.*"}), ("all_zero", {"tensor_regex": "weight/.*"})]
    table = evaluate_runs(runs, rules, steps_per_task=2)
    typo = table[table["parameters"].map(lambda p: p["tensor_regex"] == "wieght/.*")]
    assert list(typo["status"]) == ["error", "error"]
    assert all("checked nothing" in e and "wieght/.*" in e for e in typo["error"])
    fine = table[table["parameters"].map(lambda p: p["tensor_regex"] == "weight/.*")]
    assert list(fine["status"]) == ["ok", "ok"]


def test_a_rule_with_nothing_to_read_is_a_no_data_row(tmp_path):
    runs = [_write(str(tmp_path / "a"))]
    table = evaluate_runs(runs, [("vanishing_gradient", {}), ("exploding_tensor", {})], steps_per_task=2)
    by_rule = dict(zip(table["rule"], table["status"]))
    assert by_rule == {"vanishing_gradient": "no data", "exploding_tensor": "ok"}  # no gradients saved
    note = table[table["rule"] == "vanishing_gradient"]["note"].iloc[0]
    assert "nothing to check" in note
