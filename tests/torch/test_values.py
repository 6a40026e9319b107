"""What the hook saves equals what torch itself reports, step by step."""

import copy
import dataclasses
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scenarios import Net, batch
from support import NUMPY_REDUCTIONS
from torch import nn

import smdebug.pytorch as smd
from smdebug.exceptions import TensorUnavailable, TensorUnavailableForStep


class MLP(nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.fc1 = nn.Linear(6, 8, dtype=dtype)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(8, 3, dtype=dtype)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def data(step, dtype=torch.float32):
    g = torch.Generator().manual_seed(step)
    return torch.randn(5, 6, generator=g).to(dtype), torch.randint(0, 3, (5,), generator=g)


def train_recording(hook, model, steps, criterion=None, opt=None, dtype=torch.float32, inner=None):
    """Train for real; record what torch reports at each step (parameters, gradients, loss) of
    ``inner`` (the model itself unless it is wrapped)."""
    inner = inner or model
    criterion = criterion or nn.CrossEntropyLoss()
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    seen = []
    for step in range(steps):
        x, y = data(step, dtype)
        params = {n: p.detach().clone() for n, p in inner.named_parameters()}
        opt.zero_grad()
        out = model(x)
        loss = criterion(out, y)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in inner.named_parameters() if p.grad is not None}
        seen.append(
            {"params": params, "grads": grads, "loss": loss.item(), "x": x, "out": out.detach().clone()}
        )
        opt.step()
    return seen


def test_weights_gradients_losses_equal_torch_values(out_dir):
    torch.manual_seed(0)
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses"],
    )
    model = MLP()
    criterion = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(criterion)
    seen = train_recording(hook, model, steps=4, criterion=criterion)
    hook.close()

    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.tensor_names(collection="weights") == ["MLP_fc1.weight", "MLP_fc2.weight"]
    assert trial.tensor_names(collection="biases") == ["MLP_fc1.bias", "MLP_fc2.bias"]
    assert trial.tensor_names(collection="gradients") == [
        "gradient/MLP_fc1.bias",
        "gradient/MLP_fc1.weight",
        "gradient/MLP_fc2.bias",
        "gradient/MLP_fc2.weight",
    ]
    assert trial.tensor_names(collection="losses") == ["CrossEntropyLoss_output_0"]
    for step, rec in enumerate(seen):
        for pname, value in rec["params"].items():
            # the weight saved at step k is the parameter as the forward pass of step k used it
            np.testing.assert_array_equal(trial.tensor(f"MLP_{pname}").value(step), value.numpy())
            np.testing.assert_array_equal(
                trial.tensor(f"gradient/MLP_{pname}").value(step), rec["grads"][pname].numpy()
            )
        assert trial.tensor("CrossEntropyLoss_output_0").value(step) == pytest.approx(rec["loss"])
    # weights really change from step to step (the copy is taken before optimizer.step updates in place)
    assert not np.array_equal(
        trial.tensor("MLP_fc1.weight").value(0), trial.tensor("MLP_fc1.weight").value(3)
    )


def test_module_inputs_outputs_and_repeated_calls(out_dir):
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["acts"]
    )
    model = Net()
    hook.register_module(model)
    hook.get_collection("acts").add_module_tensors(model.act, inputs=True, outputs=True)
    hook.get_collection("acts").add_module_tensors(model.head)
    calls = []
    model.act.register_forward_hook(lambda m, i, o: calls.append((i[0].detach().clone(), o.detach().clone())))
    x, _ = batch(0)
    out = model(x)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names(collection="acts") == [
        "act_input_0",
        "act_input_1",
        "act_output_0",
        "act_output_1",
        "head_output_0",
    ]
    for k, (inp, outp) in enumerate(calls):
        np.testing.assert_array_equal(trial.tensor(f"act_input_{k}").value(0), inp.numpy())
        np.testing.assert_array_equal(trial.tensor(f"act_output_{k}").value(0), outp.numpy())
    np.testing.assert_array_equal(trial.tensor("head_output_0").value(0), out.detach().numpy())


def test_eval_under_no_grad_advances_steps_without_gradients(out_dir):
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "losses"],
    )
    model = MLP()
    criterion = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(criterion)
    hook.set_mode(smd.modes.TRAIN)
    train_recording(hook, model, steps=3, criterion=criterion)
    hook.set_mode(smd.modes.EVAL)
    model.eval()
    eval_losses = []
    with torch.no_grad():
        for step in range(4):
            x, y = data(50 + step)
            eval_losses.append(criterion(model(x), y).item())
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps() == list(range(7))
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 1, 2, 3]
    assert trial.tensor("gradient/MLP_fc1.weight").steps() == [0, 1, 2]
    loss = trial.tensor("CrossEntropyLoss_output_0")
    assert [loss.value(s, mode=smd.modes.EVAL).item() for s in range(4)] == pytest.approx(eval_losses)
    final = dict(model.named_parameters())["fc1.weight"].detach().numpy()
    np.testing.assert_array_equal(trial.tensor("MLP_fc1.weight").value(3, mode=smd.modes.EVAL), final)


def test_frozen_layer_is_skipped_without_crash(out_dir, caplog):
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients"],
    )
    model = MLP()
    model.fc1.requires_grad_(False)
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        seen = train_recording(hook, model, steps=2, opt=torch.optim.SGD(model.fc2.parameters(), lr=0.1))
    hook.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names(collection="gradients") == ["gradient/MLP_fc2.bias", "gradient/MLP_fc2.weight"]
    # the frozen weight is still saved (it is a weight), and never changes
    np.testing.assert_array_equal(
        trial.tensor("MLP_fc1.weight").value(1), seen[0]["params"]["fc1.weight"].numpy()
    )


def test_unfreezing_later_starts_saving_gradients(out_dir):
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["gradients"]
    )
    model = MLP()
    model.fc1.requires_grad_(False)
    hook.register_module(model)
    train_recording(hook, model, steps=1)
    model.fc1.requires_grad_(True)
    train_recording(hook, model, steps=1)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor("gradient/MLP_fc2.weight").steps() == [0, 1]
    assert trial.tensor("gradient/MLP_fc1.weight").steps() == [1]


class TwoHeads(nn.Module):
    """Outputs in a dict; the head ``b`` takes part only in the backward passes that use its output."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.a = nn.Linear(8, 3)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {"a": self.a(h), "b": self.b(h), "note": "not a tensor"}


def train_gradients(out_dir, model, steps, loss, set_to_none=True, clip=False):
    """Train with the gradients saved every step: the run, and the gradients torch computed each step
    (before clipping them, when ``clip``). ``loss(step, output, y)``: the step's loss."""
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["gradients"]
    )
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    computed = []
    for step in range(steps):
        x, y = data(step)
        opt.zero_grad(set_to_none=set_to_none)
        loss(step, model(x), y).backward()
        computed.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # in place, after the pass
        opt.step()
    hook.close()
    return smd.create_trial(out_dir), computed


@pytest.mark.parametrize("set_to_none", [False, True])
def test_gradients_are_those_of_the_step_backward_pass_before_clipping(out_dir, set_to_none):
    """Gradients zeroed in place (zero_grad(set_to_none=False)) or removed, and clipped after the backward
    pass: the saved gradient is the one the pass computed; a head the pass did not reach has no gradient
    at that step (its zeroed, stale gradient is not saved)."""

    def loss(step, out, y):  # step 2 trains head b only: head a's gradient stays zero (or none)
        return F.cross_entropy(out["b" if step == 2 else "a"], y)

    trial, computed = train_gradients(out_dir, TwoHeads(), 4, loss, set_to_none=set_to_none, clip=True)
    assert trial.tensor("gradient/TwoHeads_a.weight").steps() == [0, 1, 3]
    assert trial.tensor("gradient/TwoHeads_b.weight").steps() == [2]  # at 3, zeroed but not computed
    assert trial.tensor("gradient/TwoHeads_body.weight").steps() == [0, 1, 2, 3]
    for step in range(4):
        for name in ("body.weight", "b.bias" if step == 2 else "a.weight"):
            np.testing.assert_array_equal(
                trial.tensor(f"gradient/TwoHeads_{name}").value(step), computed[step][name].numpy()
            )


@pytest.mark.parametrize("reduced", [False, True])
def test_gradient_accumulation_saves_each_passs_own_gradient(out_dir, reduced):
    """Three micro-batches (a step each) accumulated before each optimizer step: every step saves the
    gradient its own pass computed (as smdebug 1.0.34 does), not the sum so far; reductions too."""
    rc = smd.ReductionConfig(reductions=["mean"], norms=["l2"]) if reduced else None
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["gradients"],
        reduction_config=rc,
    )
    model = MLP()
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    own = []
    for step in range(6):
        x, y = data(step)
        if step % 3 == 0:
            opt.zero_grad()
        alone = copy.deepcopy(model)  # the pass's gradient, on its own
        F.cross_entropy(alone(x), y).backward()
        own.append({n: p.grad for n, p in alone.named_parameters()})
        F.cross_entropy(model(x), y).backward()
        if step % 3 == 2:
            opt.step()
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor("gradient/MLP_fc1.weight").steps() == list(range(6))
    for step, grads in enumerate(own):
        for name, grad in grads.items():
            tensor = trial.tensor(f"gradient/MLP_{name}")
            if reduced:
                assert tensor.reduction_value(step, "l2") == pytest.approx(float(grad.norm()), rel=1e-5)
            else:
                np.testing.assert_allclose(tensor.value(step), grad.numpy(), rtol=1e-5, atol=1e-7)


@dataclasses.dataclass
class Prediction:
    logits: torch.Tensor


class DataclassOutput(MLP):
    """An output the hook cannot look into: an object of the script's own class."""

    def forward(self, x):
        return Prediction(super().forward(x))


def test_gradients_of_a_model_whose_output_is_an_object(out_dir):
    trial, computed = train_gradients(
        out_dir, DataclassOutput(), 3, lambda step, out, y: F.cross_entropy(out.logits, y)
    )
    assert len(trial.tensor_names(collection="gradients")) == 4
    for step in range(3):
        for name, grad in computed[step].items():
            np.testing.assert_array_equal(
                trial.tensor(f"gradient/DataclassOutput_{name}").value(step), grad.numpy()
            )


def test_half_precision_model_saved_readably(out_dir):
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "losses"],
    )
    model = MLP().half()
    hook.register_module(model)
    hook.register_loss(nn.CrossEntropyLoss())
    criterion = hook._loss_modules[0]
    seen = train_recording(hook, model, steps=2, criterion=criterion, dtype=torch.float16)
    hook.close()
    trial = smd.create_trial(out_dir)
    w = trial.tensor("MLP_fc1.weight").value(1)
    assert w.dtype == np.float16
    np.testing.assert_array_equal(w, seen[1]["params"]["fc1.weight"].numpy())
    g = trial.tensor("gradient/MLP_fc2.weight").value(0)
    np.testing.assert_array_equal(g, seen[0]["grads"]["fc2.weight"].numpy())
    assert float(trial.tensor("CrossEntropyLoss_output_0").value(1)) == pytest.approx(
        seen[1]["loss"], rel=1e-3
    )


def test_bfloat16_autocast_and_bfloat16_model_saved_as_float32(out_dir):
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "outs"],
        reduction_config=smd.ReductionConfig(reductions=["mean"], norms=["l2"], save_raw_tensor=True),
    )
    model = MLP()
    hook.register_module(model)
    hook.get_collection("outs").add_module_tensors(model.fc2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        loss = F.cross_entropy(out, y)
    loss.backward()
    opt.step()
    bf16 = MLP().to(torch.bfloat16)  # a second, pure bfloat16 model
    hook.register_module(bf16)
    bf16_weight = bf16.fc1.weight.detach().float().numpy()
    bf16(x.to(torch.bfloat16)).float().sum().backward()
    hook.close()
    trial = smd.create_trial(out_dir)
    saved = trial.tensor("fc2_output_0").value(0)
    assert out.dtype == torch.bfloat16 and saved.dtype == np.float32
    np.testing.assert_array_equal(saved, out.detach().float().numpy())
    assert trial.tensor("fc2_output_0").reduction_value(0, "mean") == pytest.approx(
        float(saved.mean()), rel=1e-6
    )
    assert trial.tensor("fc2_output_0").reduction_value(0, "l2") == pytest.approx(
        float(np.linalg.norm(saved)), rel=1e-6
    )
    w = trial.tensor("MLP_fc1.weight").value(1)  # step 1 is the bfloat16 model's forward
    assert w.dtype == np.float32
    np.testing.assert_array_equal(w, bf16_weight)
    assert trial.tensor("gradient/MLP_fc1.weight").value(1).dtype == np.float32


def test_reductions_instead_of_raw_tensors_equal_numpy(out_dir):
    reductions = ["min", "max", "median", "mean", "std", "variance", "sum", "prod"]
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients"],
        reduction_config=smd.ReductionConfig(
            reductions=reductions, abs_reductions=reductions, norms=["l1", "l2"], abs_norms=["l1", "l2"]
        ),
    )
    model = MLP()
    hook.register_module(model)
    seen = train_recording(hook, model, steps=2)
    hook.close()
    trial = smd.create_trial(out_dir)
    numpy_of = NUMPY_REDUCTIONS
    for step, rec in enumerate(seen):
        for name, value in [
            ("MLP_fc2.weight", rec["params"]["fc2.weight"]),
            ("gradient/MLP_fc1.bias", rec["grads"]["fc1.bias"]),
        ]:
            tensor = trial.tensor(name)
            with pytest.raises((TensorUnavailableForStep, TensorUnavailable)):
                tensor.value(step)  # only reductions were saved
            array = value.numpy().astype(np.float64)
            for red, fn in numpy_of.items():
                for absolute in (False, True):
                    expected = fn(np.abs(array) if absolute else array)
                    got = tensor.reduction_value(step, red, abs=absolute)
                    assert got == pytest.approx(expected, rel=1e-5, abs=1e-30), (name, red, absolute)


def record_conversions(monkeypatch) -> list:
    """The shapes of the tensors brought to the host: copied (to_numpy), or viewed for the writer to copy."""
    from smdebug_torch import tensors

    shapes = []
    for route in ("to_numpy", "host_view"):
        real = getattr(tensors, route)
        monkeypatch.setattr(tensors, route, lambda v, real=real: shapes.append(tuple(v.shape)) or real(v))
    return shapes


@pytest.mark.usefixtures("reduction_path")
def test_reduction_runs_on_the_tensor_device_and_only_scalars_reach_the_host(out_dir, monkeypatch):
    converted = record_conversions(monkeypatch)
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights"],
        reduction_config=smd.ReductionConfig(norms=["l2"]),
    )
    model = MLP()
    hook.register_module(model)
    hook.register_loss(nn.CrossEntropyLoss())
    seen = train_recording(hook, model, steps=1, criterion=hook._loss_modules[0])
    hook.close()
    assert converted == [()]  # only the loss (always saved raw) was copied to the host
    expected = float(np.linalg.norm(seen[0]["params"]["fc1.weight"].numpy().astype(np.float64)))
    assert smd.create_trial(out_dir).tensor("MLP_fc1.weight").reduction_value(0, "l2") == pytest.approx(
        expected
    )


def test_only_due_steps_copy_tensors(out_dir, monkeypatch):
    copies = record_conversions(monkeypatch)
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_steps=[2]),
        include_collections=["weights", "gradients"],
    )
    model = MLP()
    hook.register_module(model)
    hook.register_loss(nn.CrossEntropyLoss())
    train_recording(hook, model, steps=4, criterion=hook._loss_modules[0])
    hook.close()
    # steps 0 and 2 are due (0 by the default interval of 500): 2 weights + 4 gradients + 1 loss each
    assert len(copies) == 14
    assert smd.create_trial(out_dir).steps() == [0, 2]


def test_ddp_wrapped_model_names_and_values(out_dir):
    import os

    import torch.distributed as dist
    from scenarios import _free_port

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        hook = smd.Hook(
            out_dir=out_dir,
            save_config=smd.SaveConfig(save_interval=1),
            include_collections=["weights", "gradients"],
        )
        model = MLP()
        ddp = nn.parallel.DistributedDataParallel(model)
        hook.register_module(ddp)
        seen = train_recording(hook, ddp, steps=2)
        assert hook.worker_name() == "worker_0" and hook.num_workers() == 1
        hook.close()
    finally:
        dist.destroy_process_group()
    trial = smd.create_trial(out_dir)
    assert "DistributedDataParallel_module.fc1.weight" in trial.tensor_names(collection="weights")
    np.testing.assert_array_equal(
        trial.tensor("DistributedDataParallel_module.fc1.weight").value(1),
        seen[1]["params"]["module.fc1.weight"].numpy(),
    )
    np.testing.assert_allclose(
        trial.tensor("gradient/DistributedDataParallel_module.fc2.bias").value(1),
        seen[1]["grads"]["module.fc2.bias"].numpy(),
        rtol=1e-6,
    )


def test_model_registered_before_ddp_wrapping_keeps_plain_names(out_dir):
    import os

    import torch.distributed as dist
    from scenarios import _free_port

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        hook = smd.Hook(
            out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"]
        )
        model = MLP()
        hook.register_module(model)
        ddp = nn.parallel.DistributedDataParallel(model)
        train_recording(hook, ddp, steps=2)
        hook.close()
    finally:
        dist.destroy_process_group()
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names(collection="weights") == ["MLP_fc1.weight", "MLP_fc2.weight"]
    assert trial.steps() == [0, 1]


@pytest.mark.timeout(300)
def test_torch_compile(out_dir, caplog):
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "losses", "outs"],
    )
    model = MLP()
    compiled = torch.compile(model)
    hook.register_module(compiled)  # the compiled wrapper: names are those of the original model
    hook.get_collection("outs").add_module_tensors(model.fc1)
    criterion = nn.CrossEntropyLoss()
    hook.register_loss(criterion)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        seen = train_recording(hook, compiled, steps=3, criterion=criterion, inner=model)
    hook.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2]
    for step, rec in enumerate(seen):
        np.testing.assert_array_equal(
            trial.tensor("MLP_fc1.weight").value(step), rec["params"]["fc1.weight"].numpy()
        )
        np.testing.assert_allclose(
            trial.tensor("gradient/MLP_fc2.weight").value(step), rec["grads"]["fc2.weight"].numpy(), rtol=1e-5
        )
        assert trial.tensor("CrossEntropyLoss_output_0").value(step) == pytest.approx(rec["loss"], rel=1e-5)
    assert trial.tensor("fc1_output_0").value(2).shape == (5, 8)


@pytest.mark.timeout(300)
def test_model_compiled_fullgraph_after_registering_trains_with_one_warning(tmp_path, caplog):
    """A model registered and then compiled whole (torch.compile(model, fullgraph=True), or in place with
    model.compile(fullgraph=True)): the hook's callbacks are traced into the graph, where they cannot run.
    Training goes on, as without a hook, with one warning saying to register the compiled module."""
    torch.compiler.reset()  # graphs compiled by earlier tests (with graph breaks) would be reused
    criterion = nn.CrossEntropyLoss()
    losses = {}
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        for how in ("wrapper", "in place"):
            hook = smd.Hook(
                out_dir=str(tmp_path / how.replace(" ", "_")), save_config=smd.SaveConfig(save_interval=1)
            )
            torch.manual_seed(0)
            model = MLP()
            hook.register_module(model)
            if how == "wrapper":
                compiled = torch.compile(model, fullgraph=True)
            else:
                model.compile(fullgraph=True)
                compiled = model
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(2):
                opt.zero_grad()
                x, y = data(step)
                loss = criterion(compiled(x), y)
                loss.backward()
                opt.step()
                losses[how, step] = loss.item()
            hook.close()
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):  # the same training without a hook
        opt.zero_grad()
        x, y = data(step)
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        assert losses["wrapper", step] == losses["in place", step] == pytest.approx(loss.item(), rel=1e-5)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert (
        len(warnings) == 1
        and "fullgraph=True" in warnings[0]
        and "register the compiled module" in warnings[0]
    )


REGISTERED_THEN_COMPILED = """
import sys, torch
from torch import nn
import smdebug.pytorch as smd
assert "torch._dynamo" not in sys.modules
model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
hook = smd.Hook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=1),
                include_collections=["weights", "gradients"])
hook.register_module(model)
compiled = torch.compile(model)  # after registering: dynamo is imported only now
grads = []
for step in range(2):
    model.zero_grad()
    compiled(torch.randn(5, 6)).sum().backward()
    grads.append(model[0].weight.grad.numpy().copy())
hook.close()
trial = smd.create_trial(sys.argv[1])
assert trial.steps() == [0, 1], trial.steps()
assert (trial.tensor("gradient/Sequential_0.weight").value(1) == grads[1]).all()
"""


@pytest.mark.timeout(300)
def test_model_registered_then_compiled_saves_without_warnings(out_dir):
    """torch.compile(model) after hook.register_module(model), in a script that had not imported dynamo:
    the callbacks run eagerly between the graphs, and dynamo does not trace into the hook first (it
    warned about the builtins it met there: 'Dynamo does not know how to trace the builtin time.time')."""
    done = subprocess.run(
        [sys.executable, "-c", REGISTERED_THEN_COMPILED, out_dir], capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "smdebug" not in done.stderr, done.stderr


COMPILED_TRAINING_STEP = """
import sys, torch
from torch import nn
import smdebug.pytorch as smd
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
criterion = nn.CrossEntropyLoss()
hook = smd.Hook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=1),
                include_collections=["weights", "gradients", "losses"])
hook.register_module(model)
hook.register_loss(criterion)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

@torch.compile
def train_step(x, y):
    opt.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    return loss

seen = []
for step in range(3):
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    weight = model[0].weight.detach().clone()
    loss = train_step(x, y)
    seen.append((weight, model[0].weight.grad.clone(), loss.item()))
    opt.step()
hook.close()
trial = smd.create_trial(sys.argv[1])
assert trial.steps() == [0, 1, 2], trial.steps()
for step, (weight, grad, loss) in enumerate(seen):
    assert (trial.tensor("Sequential_0.weight").value(step) == weight.numpy()).all()
    assert (trial.tensor("gradient/Sequential_0.weight").value(step) == grad.numpy()).all()
    assert abs(trial.tensor("CrossEntropyLoss_output_0").value(step) - loss) < 1e-6
"""


@pytest.mark.timeout(300)
def test_a_compiled_training_step_saves_without_dynamo_tracing_the_hook(out_dir):
    """A training step compiled whole (forward, loss and backward inside one torch.compile'd function):
    the hook's end-of-backward work, which torch's engine calls inside that function, runs eagerly; dynamo
    compiled it as a frame of its own, warning about the builtins it met ('Dynamo does not know how to
    trace the builtin time.time')."""
    done = subprocess.run(
        [sys.executable, "-c", COMPILED_TRAINING_STEP, out_dir], capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr
    assert "Dynamo does not know" not in done.stderr and "smdebug" not in done.stderr, done.stderr


@pytest.mark.timeout(300)
def test_torch_compile_fullgraph_saves_weights_gradients_losses_with_one_warning(out_dir, caplog):
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients"],
    )
    model = MLP()
    compiled = torch.compile(model, fullgraph=True)
    criterion = nn.CrossEntropyLoss()
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.register_module(compiled)
        hook.register_loss(criterion)
        seen = train_recording(hook, compiled, steps=2, criterion=criterion, inner=model)
    hook.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "fullgraph=True" in warnings[0]
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1]
    np.testing.assert_array_equal(
        trial.tensor("MLP_fc2.weight").value(1), seen[1]["params"]["fc2.weight"].numpy()
    )
    np.testing.assert_allclose(
        trial.tensor("gradient/MLP_fc1.weight").value(1), seen[1]["grads"]["fc1.weight"].numpy(), rtol=1e-5
    )
    assert trial.tensor("CrossEntropyLoss_output_0").value(1) == pytest.approx(seen[1]["loss"], rel=1e-5)
