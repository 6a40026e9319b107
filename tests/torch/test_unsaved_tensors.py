"""A tensor the hook cannot capture: warned about once, recorded in the run, the rest of the step saved."""

import json
import logging
import os

import pytest
import torch
from torch import nn

import smdebug.pytorch as smd
from smdebug.cli import main as cli_main


class WithMetaOutput(nn.Module):
    """Returns a real tensor and one on the meta device (no data: it cannot be copied to the host)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x), torch.empty(2, device="meta")


def test_an_uncapturable_tensor_is_warned_once_and_recorded(out_dir, caplog):
    model = WithMetaOutput()
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_regex=["WithMetaOutput_output"]
    )
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        for _ in range(4):
            out, _ = model(torch.ones(1, 3))
            out.sum().backward()
    hook.close()
    warnings = [r.getMessage() for r in caplog.records if "WithMetaOutput_output_1" in r.getMessage()]
    assert len(warnings) == 1, warnings  # not once per step
    trial = smd.create_trial(out_dir)
    assert trial.tensor("WithMetaOutput_output_0").steps() == [0, 1, 2, 3]  # the rest of each step
    unsaved = trial.unsaved_tensors()
    assert list(unsaved) == ["worker_0"]
    assert unsaved["worker_0"]["WithMetaOutput_output_1"]["step"] == 0
    assert "WithMetaOutput_output_1" not in trial.tensor_names()


def test_smdebug_ls_and_the_report_show_an_unsaved_tensor(out_dir, tmp_path, capsys):
    model = WithMetaOutput()
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_regex=["WithMetaOutput_output"]
    )
    hook.register_module(model)
    for _ in range(2):
        model(torch.ones(1, 3))[0].sum().backward()
    hook.close()
    capsys.readouterr()
    assert cli_main(["ls", out_dir]) == 0
    text = capsys.readouterr().out
    assert "training ended, 1 tensor(s) NOT SAVED" in text
    assert "Unsaved tensor (worker_0): WithMetaOutput_output_1 from step 0 (could not save: " in text
    assert cli_main(["ls", "--json", out_dir]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["unsaved_tensors"]["worker_0"]["WithMetaOutput_output_1"]["step"] == 0
    page = tmp_path / "report.html"
    assert cli_main(["report", out_dir, "-o", str(page)]) == 0
    assert "WithMetaOutput_output_1 from step 0" in page.read_text()


def test_a_run_with_nothing_to_note_has_no_tensor_notes(out_dir):
    model = nn.Linear(3, 2)
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"]
    )
    hook.register_module(model)
    model(torch.ones(1, 3)).sum().backward()
    hook.close()
    assert not os.path.exists(os.path.join(out_dir, "tensor_notes"))  # as smdebug 1.0 writes the run
    assert smd.create_trial(out_dir).unsaved_tensors() == {}


class WithOddOutputs(nn.Module):
    """Returns a real tensor, one on the meta device, a nested tensor and a complex32 one."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
        return self.fc(x), torch.empty(2, device="meta"), nested, torch.ones(2, dtype=torch.complex32)


def test_tensors_without_values_take_nothing_else_of_the_step_with_them(out_dir, caplog):
    """A meta or nested tensor among a step's tensors saved as reductions: recorded unsaved, the step's
    other reductions saved (a meta output made every reduction of the step fail in the writer)."""
    model = WithOddOutputs()
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "outputs"],
        reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"], save_raw_tensor=True),
    )
    hook.get_collection("outputs").include("WithOddOutputs_output")
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        for _ in range(2):
            model(torch.ones(1, 3))[0].sum().backward()
    hook.close()
    assert "plugin 'pytorch' failed" not in caplog.text
    assert "writer error" not in caplog.text
    trial = smd.create_trial(out_dir)
    for name in ("WithOddOutputs_fc.weight", "WithOddOutputs_output_0", "WithOddOutputs_output_3"):
        for step in (0, 1):
            assert set(trial.tensor(name).reduction_values(step)) == {
                ("mean", False),
                ("max", False),
                ("l2", False),
            }, (name, step)
    weight = model.fc.weight.detach().double()  # (float32 sums in another order: an ulp apart at times)
    assert trial.tensor("WithOddOutputs_fc.weight").reduction_value(1, "l2") == pytest.approx(
        torch.linalg.norm(weight).item(), rel=1e-6
    )
    assert trial.tensor("WithOddOutputs_output_3").value(0).dtype == "complex64"  # numpy has no complex32
    unsaved = trial.unsaved_tensors()["worker_0"]
    assert sorted(unsaved) == ["WithOddOutputs_output_1", "WithOddOutputs_output_2"]


@pytest.mark.usefixtures("reduction_path")
def test_a_step_ending_inside_torch_func_transforms_keeps_its_reductions(out_dir, caplog):
    """Per-sample gradients through torch.func (vmap of grad of functional_call) with the model registered:
    its forward there starts a step, so the step before ends inside the transforms, where every result is
    a wrapper without storage: that step's reductions failed in their one host transfer ('writer error',
    all lost, nothing recorded). Now every step's weights are saved, and the transformed step's module
    outputs (the transforms' batched wrappers) are recorded as unsaved."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "outputs"],
        reduction_config=smd.ReductionConfig(norms=["l2"]),
    )
    hook.get_collection("outputs").include("Sequential_output_")
    hook.register_module(model)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_of_one(p, x):
        return functional_call(model, p, (x.unsqueeze(0),)).sum()

    x = torch.randn(5, 3)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        model(x).sum().backward()  # step 0: ordinary training
        per_sample = vmap(grad(loss_of_one), in_dims=(None, 0))(params, x)  # step 1
        model(x).sum().backward()  # step 2
    hook.close()
    assert per_sample["0.weight"].shape == (5, 4, 3)
    assert "writer error" not in caplog.text
    trial = smd.create_trial(out_dir)
    norm = torch.linalg.norm(model[0].weight.detach()).item()  # (no optimizer: the same at every step)
    assert [trial.tensor("Sequential_0.weight").reduction_value(s, "l2") for s in (0, 1, 2)] == [
        pytest.approx(norm, rel=1e-6)
    ] * 3
    out = torch.linalg.norm(model(x).detach()).item()
    assert trial.tensor("Sequential_output_0").reduction_value(0, "l2") == pytest.approx(out, rel=1e-6)
    assert trial.unsaved_tensors()["worker_0"]["Sequential_output_0"]["step"] == 1
