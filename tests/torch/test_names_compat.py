"""Same script, same model: this plugin saves exactly the tensor names smdebug 1.0.34 saved, step by step.

The golden file was produced by running ``scenarios.py`` with the real smdebug 1.0.34 (and torch 2.13).
"""

import json
import os

import pytest
import scenarios

import smdebug.pytorch as smd

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "smdebug_1_0_34_names.json")


@pytest.fixture(scope="module")
def golden():
    with open(GOLDEN) as f:
        return json.load(f)


@pytest.mark.parametrize("scenario", sorted(scenarios.SCENARIOS))
def test_same_names_steps_and_modes_as_smdebug_1_0_34(scenario, golden, out_dir):
    got = scenarios.run_scenario(smd, scenario, out_dir)
    expected = golden[scenario]
    assert sorted(got, key=int) == sorted(expected, key=int), "saved steps differ"
    for step, entry in expected.items():
        assert (got[step]["mode"], got[step]["mode_step"]) == (entry["mode"], entry["mode_step"]), step
        missing = sorted(set(entry["names"]) - set(got[step]["names"]))
        extra = sorted(set(got[step]["names"]) - set(entry["names"]))
        assert not missing and not extra, f"step {step}: missing {missing}, extra {extra}"


def test_golden_covers_the_interesting_names(golden):
    names = set(golden["save_all_train_eval"]["0"]["names"])
    # model parameters: <ModelClass>_<named_parameters name>; gradients prefixed; nested modules by path
    assert {"Net_conv1.weight", "gradient/Net_conv1.weight", "Net_layers.0.bn.bias"} <= names
    # a module called twice in one step, a module returning a nested tuple, the model and the loss
    assert {
        "act_output_0",
        "act_output_1",
        "rnn_output_2",
        "Net_output_0",
        "CrossEntropyLoss_output_0",
    } <= names
    ddp = set(golden["ddp_wrapped"]["1"]["names"])
    assert {"DistributedDataParallel_module.conv1.weight", "module.conv1_output_0"} <= ddp
