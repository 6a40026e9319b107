"""health=True: every step's statistics in a flight recorder, written when something goes wrong, and the
provenance of the first non-finite value, with faults planted into real torch training."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from support import chromium, first_loss_spike, run_ranks, script_errors, smdebug_cli
from torch import nn

import smdebug.pytorch as smd
from smdebug.cli import main as cli
from smdebug.exceptions import ConfigError, TensorUnavailableForStep
from smdebug.rules.rule import Rule
from smdebug_torch import native

WORKER = os.path.join(os.path.dirname(__file__), "health_worker.py")
FAULT = 6


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def train(out_dir, fault=None, steps=10, lr_jump_at=None, rule=None, lagged=False, **hook_args):
    """Train Net with health on; a fault planted at step FAULT. Returns (hook, every step's record of
    what torch computed before the optimizer step)."""
    torch.manual_seed(0)
    model = Net()
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook_args.setdefault("save_config", smd.SaveConfig(save_interval=5))
    hook = smd.Hook(out_dir=out_dir, health=True, **hook_args)
    hook.register_module(model)
    hook.register_loss(criterion)
    if rule is not None:
        hook.add_rule(rule, action=None)

    def plant_forward(module, inputs, output):
        if fault == "forward" and hook.step == FAULT:
            output = output.clone()
            output[0, 1] = float("inf")
            return output
        return None

    model.fc1.register_forward_hook(plant_forward)
    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(steps, 16, 4, generator=g), torch.randint(0, 3, (steps, 16), generator=g)
    seen = {}
    for step in range(steps):
        if lagged and step == 1:  # judge each row a step late, as on an accelerator
            hook._health._ring_host = None
        if step == lr_jump_at:
            for group in opt.param_groups:
                group["lr"] = 300.0
        x = xs[step].clone()
        if fault == "input" and step == FAULT:
            x[3, 2] = float("nan")
        opt.zero_grad()
        loss = criterion(model(x), ys[step])
        loss.backward()
        if fault == "gradient" and step == FAULT:
            model.fc2.bias.grad[1] = float("nan")
        seen[step] = {
            "loss": loss.item(),
            "gradient/Net_fc1.weight": model.fc1.weight.grad.norm().item(),
            "Net_fc2.weight": model.fc2.weight.detach().abs().max().item(),
        }
        opt.step()
    hook.close()
    return hook, seen


def hooked_net(out_dir):
    """A seeded Net and its loss, both registered with a health hook (a save step every 100 steps)."""
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_module(model)
    hook.register_loss(criterion)
    return model, criterion, hook


def why(out_dir, *args, command="why"):
    from contextlib import redirect_stdout
    from io import StringIO

    buffer = StringIO()
    with redirect_stdout(buffer):
        code = cli([command, *args, out_dir])
    assert code == 0
    return buffer.getvalue()


def assert_recorded_before(trial, seen, last):
    """The recorder's rows of the steps before the fault, as ordinary reductions of their own steps."""
    for step in range(last):
        grad = trial.tensor("gradient/Net_fc1.weight").reduction_value(step, "l2")
        assert grad == pytest.approx(seen[step]["gradient/Net_fc1.weight"], rel=1e-5)
        weight = trial.tensor("Net_fc2.weight").reduction_value(step, "max", abs=True)
        assert weight == pytest.approx(seen[step]["Net_fc2.weight"], rel=1e-6)
        loss = trial.tensor("CrossEntropyLoss_output_0").reduction_value(step, "l2")
        assert loss == pytest.approx(seen[step]["loss"], rel=1e-6)


def test_healthy_run_writes_nothing_between_save_steps(out_dir):
    _, seen = train(out_dir, steps=12)
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 5, 10]  # no step of its own for the recorder
    assert trial.first_nonfinite() is None
    # the save steps carry the health statistics too
    grad = trial.tensor("gradient/Net_fc1.weight").reduction_value(5, "l2")
    assert grad == pytest.approx(seen[5]["gradient/Net_fc1.weight"], rel=1e-5)
    assert "Nothing was found" in why(out_dir)
    assert "First non-finite: none" in why(out_dir, command="ls")
    assert json.loads(why(out_dir, "--json")) is None
    (record,) = trial.health_records()
    assert record["triggers"] == [] and record["recorder"]["steps"] == 100


@pytest.mark.parametrize(
    "fault, direction, module, tensor",
    [
        ("forward", "forward", "fc1", "fc1_output_0"),
        ("gradient", "backward", "fc2", "gradient/Net_fc2.bias"),
        ("input", "input", "Net", "Net_input_0"),
    ],
)
def test_first_nonfinite_names_where_it_appeared(kernel, out_dir, fault, direction, module, tensor):
    _, seen = train(out_dir, fault=fault)
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert first is not None
    assert {k: first[k] for k in ("step", "mode", "direction", "module", "tensor", "worker")} == {
        "step": FAULT,
        "mode": "GLOBAL",
        "direction": direction,
        "module": module,
        "tensor": tensor,
        "worker": "worker_0",
    }
    assert_recorded_before(trial, seen, FAULT)
    # the bad step's row is there as well (the fault spread: the loss is non-finite at the next steps)
    assert not np.isfinite(trial.tensor(f"gradient/Net_{'fc2.bias'}").reduction_value(FAULT, "l2"))
    # the losses collection (the default one) names the loss: its raw value at the bad step is saved
    trial.tensor("CrossEntropyLoss_output_0").value(FAULT)
    # nothing after the fault but the save steps
    assert trial.steps() == [0, 1, 2, 3, 4, 5, 6]
    text = why(out_dir)
    assert f"step {FAULT}" in text and tensor in text and "steps 0, 1, 2, 3, 4, 5 before it" in text
    assert json.loads(why(out_dir, "--json"))["tensor"] == tensor
    listing = why(out_dir, command="ls")
    assert f"First non-finite: step {FAULT} (GLOBAL) on worker_0, {direction} {tensor}" in listing
    assert json.loads(why(out_dir, "--json", command="ls"))["first_nonfinite"]["module"] == module


def test_report_page_shows_where_the_first_nonfinite_value_appeared(out_dir, tmp_path):
    """``smdebug report`` of a run with a NaN in the input at step FAULT: the page's provenance panel names
    the step and the input, and renders in headless Chromium."""
    train(out_dir, fault="input")
    page = tmp_path / "nan.html"
    assert smdebug_cli("report", out_dir, "-o", page, "--no-rules").returncode == 0
    panel = page.read_text().split('id="provenance"', 1)[1].split("</section>", 1)[0]
    assert f"<th>step</th><td class='mono'>{FAULT}</td>" in panel and "input" in panel
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == [] and 'data-render="ok"' in dom


def test_rows_judged_a_step_late_name_the_gradient_and_its_step(out_dir):
    # an accelerator's rows reach the host a step late: the parameters have moved on, no re-run
    _, seen = train(out_dir, fault="gradient", lagged=True)
    first = smd.create_trial(out_dir).first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (
        FAULT,
        "backward",
        "gradient/Net_fc2.bias",
    )
    assert_recorded_before(smd.create_trial(out_dir), seen, FAULT)


def test_raw_tensors_of_the_triggering_step_follow_the_users_collections(out_dir):
    train(out_dir, fault="gradient", include_collections=["gradients"])
    trial = smd.create_trial(out_dir)
    value = trial.tensor("gradient/Net_fc2.bias").value(FAULT)
    assert np.isnan(value[1]) and np.isfinite(value[0])
    with pytest.raises(TensorUnavailableForStep):  # weights were not asked for: their statistics only
        trial.tensor("Net_fc1.weight").value(FAULT)
    assert trial.tensor("Net_fc1.weight").reduction_value(FAULT, "l2") > 0


def test_a_trigger_saves_the_layer_outputs_the_users_collections_name(out_dir):
    # the step's layer outputs are gone once its forward pass returned: a re-run gives them back
    train(out_dir, fault="forward", include_regex=["fc1_output_0", "fc2_input_0"])
    trial = smd.create_trial(out_dir)
    assert trial.first_nonfinite()["tensor"] == "fc1_output_0"
    for name in ("fc1_output_0", "fc2_input_0"):
        value = trial.tensor(name).value(FAULT)
        assert value.shape == (16, 8) and np.isinf(value[0, 1]) and np.isfinite(value[1:]).all()
    assert trial.tensor("fc1_output_0").steps() == [0, 5, FAULT]  # (and at the save steps)


def test_loss_spike_from_a_learning_rate_jump(out_dir):
    _, seen = train(
        out_dir,
        steps=14,
        lr_jump_at=9,
        health_loss_factor=3,
        include_collections=["gradients"],
        save_config=smd.SaveConfig(save_interval=100),
    )
    trial = smd.create_trial(out_dir)
    spike = first_loss_spike(trial)
    assert spike > 9 and seen[spike]["loss"] > 3 * np.median([seen[s]["loss"] for s in range(9)])
    assert_recorded_before(trial, seen, spike)
    # the spiking step's gradients, raw, as the user's collections save them
    grad = trial.tensor("gradient/Net_fc1.weight").value(spike)
    assert np.linalg.norm(grad) == pytest.approx(seen[spike]["gradient/Net_fc1.weight"], rel=1e-5)


def test_a_short_recorder_still_judges_loss_spikes_against_the_recent_losses(out_dir):
    # health_steps=3 holds fewer steps than a spike needs before it is judged (5): the losses are kept apart
    _, seen = train(
        out_dir,
        steps=14,
        lr_jump_at=9,
        health_loss_factor=3,
        health_steps=3,
        save_config=smd.SaveConfig(save_interval=100),
    )
    trial = smd.create_trial(out_dir)
    spike = first_loss_spike(trial)
    assert spike > 9 and seen[spike]["loss"] > 3 * np.median([seen[s]["loss"] for s in range(9)])
    # step 0 saved, then the recorder's 3 steps (the loss keeps growing: later spikes write theirs too)
    assert [s for s in trial.steps() if s <= spike] == [0, spike - 2, spike - 1, spike]


def test_a_model_with_buffers_is_run_again_to_name_the_faulty_module(out_dir):
    # BatchNorm's running statistics are buffers: restored after the re-run, which names the module
    magic = 12345.0

    def run(hooked):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(48, 3))
        model[0].register_forward_hook(
            lambda m, i, o: o.clone().fill_(float("inf")) if (i[0] == magic).any() else None
        )
        criterion = nn.CrossEntropyLoss()
        if hooked:
            hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
            hook.register_module(model)
            hook.register_loss(criterion)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        for step in range(6):
            x, y = torch.randn(5, 1, 6, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
            if step == 4:
                x.view(-1)[0] = magic
            opt.zero_grad()
            criterion(model(x), y).backward()
            opt.step()
        if hooked:
            hook.close()
        return model[1].running_mean.clone()

    assert torch.equal(run(hooked=True), run(hooked=False))
    first = smd.create_trial(out_dir).first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (4, "forward", "0_output_0"), first


class FiresFromStepFive(Rule):
    def invoke_at_step(self, step):
        return step >= 5


def test_a_rule_firing_in_training_writes_the_recorder(out_dir):
    _, seen = train(out_dir, steps=8, rule=FiresFromStepFive)
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3, 4, 5]  # the rule judged step 5; the recorder wrote 1-4
    assert_recorded_before(trial, seen, 5)
    reasons = [t["reason"] for t in trial.health_records()[0]["triggers"]]
    assert reasons and reasons[0].startswith("rule FiresFromStepFive fired")
    assert trial.first_nonfinite() is None


def test_health_from_the_json_configuration(tmp_path, monkeypatch):
    config = tmp_path / "config.json"
    out = str(tmp_path / "run")
    config.write_text(
        json.dumps(
            {
                "LocalPath": out,
                "HookParameters": {"health": "true", "health_steps": "7", "save_interval": "50"},
            }
        )
    )
    hook = smd.Hook.create_from_json_file(str(config))
    assert hook.health is not None and hook.health.capacity == 7
    hook.close()
    with pytest.raises(ConfigError, match="health_steps"):
        smd.Hook(out_dir=str(tmp_path / "x"), health=True, health_steps=0)


def test_recorder_keeps_only_its_last_steps(out_dir):
    _, seen = train(out_dir, fault="gradient", health_steps=3, save_config=smd.SaveConfig(save_interval=100))
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 4, 5, 6]  # step 0 saved (the losses), then the recorder's last 3 steps
    for step in (0, 4, 5):
        grad = trial.tensor("gradient/Net_fc1.weight").reduction_value(step, "l2")
        assert grad == pytest.approx(seen[step]["gradient/Net_fc1.weight"], rel=1e-5)
    # its size, stated: 3 steps x 9 tensors (4 weights, 4 gradients, the loss) x 2 float32 statistics
    recorder = trial.health_records()[0]["recorder"]
    assert recorder == {"steps": 3, "tensors": 9, "memory": "216 B"}


def run_worker(out_dir, case, env=None):
    proc = subprocess.run(
        [sys.executable, WORKER, out_dir, case, "4"], env=env, capture_output=True, text=True, timeout=240
    )
    return proc


def read_norms(out_dir, rank=0):
    with open(f"{out_dir}.norms_{rank}.json") as f:
        return {int(k): v for k, v in json.load(f).items()}


@pytest.mark.timeout(120)
def test_sigterm_writes_the_recorder(out_dir):
    proc = run_worker(out_dir, "sigterm")
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    trial = smd.create_trial(out_dir)
    norms = read_norms(out_dir)
    for step in (1, 2, 3):
        value = trial.tensor("gradient/Net_fc2.weight").reduction_value(step, "l2")
        assert value == pytest.approx(norms[step], rel=1e-5)
    assert any("SIGTERM" in t["reason"] for t in trial.health_records()[0]["triggers"])
    assert trial.first_nonfinite() is None


@pytest.mark.timeout(120)
def test_training_that_raises_writes_the_recorder(out_dir):
    proc = run_worker(out_dir, "raise")
    assert proc.returncode == 1 and "the data loader broke" in proc.stderr
    trial = smd.create_trial(out_dir)
    norms = read_norms(out_dir)
    assert trial.tensor("gradient/Net_fc2.weight").reduction_value(3, "l2") == pytest.approx(
        norms[3], rel=1e-5
    )
    reasons = [t["reason"] for t in trial.health_records()[0]["triggers"]]
    assert any("RuntimeError" in r for r in reasons), reasons


@pytest.mark.timeout(300)
def test_fault_on_rank_one_of_two(out_dir):
    run_ranks(WORKER, out_dir, "rank", "4")
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["worker"], first["direction"], first["module"], first["tensor"]) == (
        4,
        "worker_1",
        "forward",
        "fc1",
        "fc1_output_0",
    )
    records = {r["worker"]: r["first_nonfinite"] for r in trial.health_records()}
    # rank 0 saw it only through the averaged gradients
    assert records["worker_0"]["direction"] == "backward" and records["worker_0"]["step"] == 4
    norms = read_norms(out_dir, 1)
    value = trial.tensor("gradient/Net_fc2.weight").reduction_value(3, "l2", worker="worker_1")
    assert value == pytest.approx(norms[3], rel=1e-5)
    # smdebug why tells what worker_1's recorder shows (each rank has its own batches, so its own loss)
    losses = [trial.tensor("CrossEntropyLoss_output_0").reduction_value(0, "l2", worker=w) for w in records]
    assert losses[0] != losses[1]
    mine = trial.tensor("CrossEntropyLoss_output_0").reduction_value(0, "l2", worker="worker_1")
    assert f"the loss went from {mine:.4g} to " in why(out_dir)
    # step 0 saved each rank's own gradient (before the all-reduce): its reductions are that value's,
    # not the recorder's (of the averaged gradient, the same on both ranks)
    grad = trial.tensor("gradient/Net_fc2.weight")
    own = [np.linalg.norm(grad.value(0, worker=w)) for w in ("worker_0", "worker_1")]
    assert own[0] != pytest.approx(own[1], rel=1e-3)
    for worker, norm in zip(("worker_0", "worker_1"), own):
        assert grad.reduction_value(0, "l2", worker=worker) == pytest.approx(norm, rel=1e-5)
        assert (
            grad.reduction_value(0, "max", worker=worker, abs=True)
            == np.abs(grad.value(0, worker=worker)).max()
        )


@pytest.mark.timeout(300)
def test_why_says_whose_recorder_it_shows_when_the_faulty_rank_saves_no_tensors(out_dir):
    run_ranks(WORKER, out_dir, "rank-one-writer", "4")
    trial = smd.create_trial(out_dir)
    assert trial.workers() == ["worker_0"] and trial.first_nonfinite()["worker"] == "worker_1"
    text = why(out_dir)
    assert "worker_1 saved no tensors (include_workers); the flight recorder of worker_0 holds steps" in text


UNMODIFIED = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
criterion = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    x = torch.randn(8, 4)
    if step == 5:
        x[0, 0] = float("nan")
    opt.zero_grad()
    criterion(model(x), torch.randint(0, 3, (8,))).backward()
    opt.step()
"""


@pytest.mark.timeout(120)
def test_smdebug_run_health_watches_an_unmodified_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNMODIFIED)
    out = str(tmp_path / "run")
    smdebug = os.path.join(os.path.dirname(sys.executable), "smdebug")
    done = subprocess.run(
        [smdebug, "run", "--health", "--out-dir", out, "--", "python", str(script)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    first = smd.create_trial(out).first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (5, "input", "Sequential_input_0")


def test_recorded_statistics_of_stacked_packed_and_large_tensors(kernel, out_dir):
    # the statistics are computed in groups: same-shape tensors stacked (four 8x8 layers), the other small
    # ones packed zero-padded into one matrix, large ones alone (a 2100x8 weight): each recorded value is
    # the tensor's own, all-negative and mixed tensors alike
    torch.manual_seed(0)
    layers = [nn.Linear(8, 8) for _ in range(4)] + [nn.Linear(8, 2100), nn.Linear(2100, 3)]
    model = nn.Sequential(*layers)
    with torch.no_grad():
        layers[1].weight.copy_(-layers[1].weight.abs() - 0.5)  # all negative: |x| is its minimum's
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_module(model)
    hook.register_loss(criterion)
    g = torch.Generator().manual_seed(2)
    seen = {}
    for step in range(4):
        opt.zero_grad()
        loss = criterion(model(torch.randn(5, 8, generator=g)), torch.randint(0, 3, (5,), generator=g))
        loss.backward()
        if step == 3:
            layers[5].bias.grad[0] = float("nan")
        seen[step] = {
            name: (t.norm().item(), t.abs().max().item())
            for name, t in [
                *((f"Sequential_{n}", p.detach()) for n, p in model.named_parameters()),
                *((f"gradient/Sequential_{n}", p.grad) for n, p in model.named_parameters()),
                ("CrossEntropyLoss_output_0", loss.detach()),
            ]
        }
        opt.step()
    hook.close()
    assert (hook._health._layout.watch is not None) == (kernel == "native")  # the path under test ran
    trial = smd.create_trial(out_dir)
    assert trial.first_nonfinite()["tensor"] == "gradient/Sequential_5.bias"
    for step in range(3):
        for name, (l2, top) in seen[step].items():
            assert trial.tensor(name).reduction_value(step, "l2") == pytest.approx(l2, rel=1e-5), name
            assert trial.tensor(name).reduction_value(step, "max", abs=True) == pytest.approx(top, rel=1e-6)


def test_gradscaler_overflow_steps_are_not_a_first_nonfinite(kernel, out_dir):
    # float16 autocast with a scale far too large: GradScaler finds inf gradients, skips those optimizer
    # steps and lowers the scale, by design; the weights stay finite. A NaN input batch later is found.
    model, criterion, hook = hooked_net(out_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**60)
    skipped = []
    for step in range(12):
        x = torch.randn(8, 4)
        if step == 10:
            x[1, 1] = float("nan")
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = criterion(model(x), torch.randint(0, 3, (8,)))
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() < scale:
            skipped.append(step)
    hook.close()
    assert skipped[:3] == [0, 1, 2] and all(torch.isfinite(p).all() for p in model.parameters())
    first = smd.create_trial(out_dir).first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (10, "input", "Net_input_0")


def test_skipped_overflow_steps_alone_write_nothing(out_dir):
    model, criterion, hook = hooked_net(out_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**60)
    for _ in range(6):  # every step overflows and is skipped, the last one included
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = criterion(model(torch.randn(8, 4)), torch.randint(0, 3, (8,)))
        scaler.scale(loss * 1e30).backward()
        scaler.step(opt)
        scaler.update()
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.first_nonfinite() is None and trial.steps() == [0]
    assert "Nothing was found" in why(out_dir)


@pytest.mark.parametrize("fault", ["gradient", "forward"])
def test_manual_update_without_an_optimizer(kernel, out_dir, fault):
    # no optimizer: each step is recorded at the end of its backward pass (the gradients are there,
    # zero_grad comes before the next forward); a NaN written into a gradient after backward is named
    model, criterion, hook = hooked_net(out_dir)

    def plant(module, inputs, output):
        if fault == "forward" and hook.step == FAULT:
            return output * float("inf")
        return None

    model.fc2.register_forward_hook(plant)
    seen = {}
    for step in range(9):
        model.zero_grad()
        criterion(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
        seen[step] = model.fc1.weight.grad.norm().item()
        if fault == "gradient" and step == FAULT:
            model.fc1.weight.grad[0, 0] = float("nan")
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    expected = {
        "gradient": ("backward", "fc1", "gradient/Net_fc1.weight"),
        "forward": ("forward", "fc2", "fc2_output_0"),
    }
    assert (first["step"], first["direction"], first["module"], first["tensor"]) == (FAULT, *expected[fault])
    for step in range(FAULT):
        value = trial.tensor("gradient/Net_fc1.weight").reduction_value(step, "l2")
        assert value == pytest.approx(seen[step], rel=1e-5)


def test_training_that_raises_inside_try_finally_writes_the_recorder(out_dir):
    # the script closes the hook itself on its way out (try/finally): the exception is still a trigger
    model, criterion, hook = hooked_net(out_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError):
        try:
            for step in range(10):
                if step == 4:
                    raise ValueError("the data loader broke")
                opt.zero_grad()
                criterion(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
                opt.step()
        finally:
            hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3]
    reasons = [t["reason"] for t in trial.health_records()[0]["triggers"]]
    assert reasons == ["training raised ValueError: the data loader broke"]


def test_a_loss_recorded_with_record_tensor_value_is_watched(out_dir):
    # no loss module: the script computes the loss functionally and records it into the losses collection
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_module(model)
    seen = {}
    for step in range(8):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 3, (8,)))
        if step == FAULT:
            loss = loss * torch.log(torch.zeros(()))  # -inf, from finite model outputs
        hook.record_tensor_value("loss", loss)
        seen[step] = loss.item()
        loss.backward()
        opt.step()
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (FAULT, "loss", "loss_output_0")
    for step in range(1, FAULT):
        assert trial.tensor("loss_output_0").reduction_value(step, "l2") == pytest.approx(
            seen[step], rel=1e-6
        )


def test_a_parameter_unfrozen_during_training_is_watched(out_dir):
    # fine-tuning: fc1 frozen for the first steps, then trained; its gradient is watched from then on
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    model.fc1.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_module(model)
    hook.register_loss(criterion)
    seen = {}
    for step in range(8):
        if step == 3:
            model.fc1.requires_grad_(True)
        opt.zero_grad()
        criterion(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
        if step == FAULT:
            model.fc1.weight.grad[0, 0] = float("nan")
        elif step >= 3:
            seen[step] = model.fc1.weight.grad.norm().item()
        opt.step()
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (
        FAULT,
        "backward",
        "gradient/Net_fc1.weight",
    )
    for step in range(3, FAULT):
        value = trial.tensor("gradient/Net_fc1.weight").reduction_value(step, "l2")
        assert value == pytest.approx(seen[step], rel=1e-5)


@pytest.mark.parametrize("mode", ["EVAL", "PREDICT"])
def test_a_fault_in_an_evaluation_step_is_found_in_that_step(out_dir, mode):
    # evaluation after training: the fault is planted for one batch by the script's own flag (not the
    # hook's step), inf from fc2 with a loss (EVAL), a NaN input batch without one (PREDICT)
    model, criterion, hook = hooked_net(out_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    planted = {"now": False}
    model.fc2.register_forward_hook(
        lambda m, i, o: o * float("inf") if planted["now"] and mode == "EVAL" else None
    )
    for _ in range(3):
        opt.zero_grad()
        criterion(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
        opt.step()
    hook.set_mode(getattr(smd.modes, mode))
    with torch.no_grad():
        for batch in range(3):
            x = torch.randn(8, 4)
            planted["now"] = batch == 1
            if planted["now"] and mode == "PREDICT":
                x[0, 0] = float("nan")
            out = model(x)
            if mode == "EVAL":
                criterion(out, torch.randint(0, 3, (8,)))
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    expected = ("forward", "fc2", "fc2_output_0") if mode == "EVAL" else ("input", "Net", "Net_input_0")
    assert (first["step"], first["mode"], first["mode_step"]) == (4, mode, 1)
    assert (first["direction"], first["module"], first["tensor"]) == expected


@pytest.mark.parametrize("fault", ["forward", "gradient"])
def test_gradient_accumulation_names_a_fault_of_a_micro_step(out_dir, fault):
    # three backward passes per optimizer step: the fault is in step 4, a step without an optimizer step
    model, criterion, hook = hooked_net(out_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.fc2.register_forward_hook(
        lambda m, i, o: o * float("inf") if fault == "forward" and hook.step == 4 else None
    )
    for step in range(9):
        criterion(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
        if fault == "gradient" and step == 4:
            model.fc1.weight.grad[0, 0] = float("nan")
        if step % 3 == 2:
            opt.step()
            opt.zero_grad()
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    expected = (
        ("forward", "fc2", "fc2_output_0")
        if fault == "forward"
        else ("backward", "fc1", "gradient/Net_fc1.weight")
    )
    assert (first["step"], first["direction"], first["module"], first["tensor"]) == (4, *expected)


def test_a_save_step_holds_each_reduction_once(out_dir):
    # the hook reduces the gradients as the recorder does: the step's index names each result once, and
    # the value is the hook's own (a GradScaler run's hook value is the scaled gradient's)
    reductions = smd.ReductionConfig(norms=["l2"], abs_reductions=["max"])
    _, seen = train(out_dir, steps=6, include_collections=["gradients"], reduction_config=reductions)
    with open(os.path.join(out_dir, "index", "000000000", f"{5:012d}_worker_0.json")) as f:
        names = [t["tensorname"] for t in json.load(f)["tensor_payload"]]
    assert len(names) == len(set(names))
    assert "smdebug/reductions/l2/gradient/Net_fc1.weight" in names  # (the hook's and the recorder's)
    assert "smdebug/reductions/l2/Net_fc1.weight" in names  # (the recorder's alone)
    grad = smd.create_trial(out_dir).tensor("gradient/Net_fc1.weight").reduction_value(5, "l2")
    assert grad == pytest.approx(seen[5]["gradient/Net_fc1.weight"], rel=1e-5)


def test_why_with_a_model_called_twice_a_step_names_the_last_gradients_recorded(out_dir):
    # each forward is a step: the first call's step ends before any backward, its row has no gradients
    model, criterion, hook = hooked_net(out_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for it in range(4):
        x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        loss = criterion(model(x[:8]), y[:8]) + criterion(model(x[8:]), y[8:])
        loss.backward()
        if it == 3:
            model.fc2.bias.grad[1] = float("nan")
        opt.step()
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (7, "backward", "gradient/Net_fc2.bias")
    text = why(out_dir)
    assert "nan" not in text  # (step 6 recorded no gradient: its norm is no NaN)
    assert "the largest gradient norm at step 5 was" in text
    assert "the fastest-growing was" in text and "since step 1" in text


def test_why_says_no_gradient_norm_grew_when_every_one_fell(out_dir):
    # one batch, learnt: every gradient norm falls, and none is called the fastest-growing at x0.9
    model, criterion, hook = hooked_net(out_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g)
    norms = []
    for step in range(8):
        opt.zero_grad()
        criterion(model(x), y).backward()
        norms.append([p.grad.norm().item() for p in model.parameters()])
        if step == 7:
            model.fc2.bias.grad[0] = float("nan")
        opt.step()
    hook.close()
    assert all(now < then for now, then in zip(norms[6], norms[0]))
    text = why(out_dir)
    assert "no gradient norm grew since step 0" in text and "fastest-growing" not in text


class InterruptedWorkerData(torch.utils.data.Dataset):
    """Batches of 8 for Net, a NaN in batch 2's input; the worker making batch 6 gets SIGINT (as Ctrl-C
    reaches the whole process group) and goes on."""

    def __len__(self):
        return 8 * 10

    def __getitem__(self, i):
        if i == 8 * 6:
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                pass
        x = torch.full((4,), float(i % 5))
        if i == 8 * 2:
            x[0] = float("nan")
        return x, i % 3


def test_a_signal_in_a_data_loader_worker_leaves_the_runs_record_alone(out_dir):
    # the worker is a forked copy of the training process, with its signal handlers and its recorder
    model, criterion, hook = hooked_net(out_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in torch.utils.data.DataLoader(InterruptedWorkerData(), batch_size=8, num_workers=1):
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert first is not None and (first["step"], first["direction"]) == (2, "input")
    assert not any("SIGINT" in t["reason"] for t in trial.health_records()[0]["triggers"])


def test_a_float16_overflow_under_autocast_is_named_at_its_layer(out_dir):
    # the re-run of the bad step (at the optimizer step, outside the autocast block) runs under the
    # step's autocast: in float32 the overflow would not happen again
    model, criterion, hook = hooked_net(out_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(8):
        x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
        if step == FAULT:
            x = x * 1e6  # finite, but past float16's range once through fc1
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = criterion(model(x), y)
        loss.backward()
        opt.step()
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    assert (first["step"], first["direction"], first["module"], first["tensor"]) == (
        FAULT,
        "forward",
        "fc1",
        "fc1_output_0",
    )


def test_an_ignored_sigint_stays_ignored(out_dir):
    # a shell script's background job starts with SIGINT ignored: Ctrl-C there stops nothing, triggers nothing
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        model, criterion, hook = hooked_net(out_dir)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)
            opt.zero_grad()
            criterion(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
            opt.step()
        hook.close()
    finally:
        signal.signal(signal.SIGINT, previous)
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0] and trial.health_records()[0]["triggers"] == []


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head_a = nn.Linear(8, 3)
        self.head_b = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.head_a(h), self.head_b(h)


def test_a_second_optimizer_of_the_step_is_recorded_and_judged(out_dir):
    # one optimizer per part of the model, each stepping after its own backward pass
    torch.manual_seed(0)
    net, ce, mse = TwoHeads(), nn.CrossEntropyLoss(), nn.MSELoss()
    opt_a = torch.optim.SGD([*net.body.parameters(), *net.head_a.parameters()], lr=0.1)
    opt_b = torch.optim.SGD(net.head_b.parameters(), lr=0.1)
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_module(net)
    g = torch.Generator().manual_seed(1)
    seen = {}
    for step in range(8):
        x, y, z = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g), torch.randn(8, 1)
        a, b = net(x)
        opt_a.zero_grad()
        ce(a, y).backward(retain_graph=True)
        opt_a.step()
        opt_b.zero_grad()
        mse(b, z).backward()
        if step == FAULT:
            net.head_b.bias.grad[0] = float("nan")
        seen[step] = net.head_b.weight.grad.norm().item()
        opt_b.step()
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (
        FAULT,
        "backward",
        "gradient/TwoHeads_head_b.bias",
    )
    for step in range(FAULT):  # the second optimizer's gradients as it applied them, not the step before's
        value = trial.tensor("gradient/TwoHeads_head_b.weight").reduction_value(step, "l2")
        assert value == pytest.approx(seen[step], rel=1e-5)


def test_another_models_optimizer_records_nothing(out_dir):
    # The optimizer pre-hook is global: the optimizer of a model trained beside the registered one (not
    # registered) must not record the registered model's step again, after its update.
    torch.manual_seed(0)
    model, other, criterion = Net(), Net(), nn.CrossEntropyLoss()
    opt, other_opt = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, other))
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_module(model)
    hook.register_loss(criterion)
    g = torch.Generator().manual_seed(1)
    seen = {}
    for step in range(8):
        x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        criterion(model(x), y).backward()
        if step == FAULT:
            model.fc2.bias.grad[1] = float("nan")
        seen[step] = model.fc2.weight.detach().abs().max().item()
        opt.step()
        other_opt.zero_grad()
        nn.functional.cross_entropy(other(x), y).backward()
        other_opt.step()
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["tensor"]) == (FAULT, "gradient/Net_fc2.bias")
    for step in range(1, FAULT):  # the weights the step used, not those after its update
        value = trial.tensor("Net_fc2.weight").reduction_value(step, "max", abs=True)
        assert value == pytest.approx(seen[step], rel=1e-6)


@pytest.mark.parametrize("twin", [False, True])
def test_a_gradient_that_gradscaler_keeps_from_its_optimizer_is_no_fault(out_dir, twin):
    # One optimizer per layer under a GradScaler: a non-finite gradient of fc2 makes the scaler skip fc2's
    # optimizer only; fc1's steps. Nothing non-finite reached the model: no first non-finite value. With
    # a twin (a second registered Net, its tensors of the same names, trained after it), the twin's
    # optimizer does not apply the model's gradient either.
    torch.manual_seed(0)
    model, other, criterion = Net(), Net(), nn.CrossEntropyLoss()
    opts = [torch.optim.SGD(layer.parameters(), lr=0.1) for layer in (model.fc1, model.fc2)]
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_module(model)
    hook.register_loss(criterion)
    if twin:
        hook.register_module(other)
    g = torch.Generator().manual_seed(1)
    for step in range(8):
        x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
        for opt in opts:
            opt.zero_grad()
        scaler.scale(criterion(model(x), y)).backward()
        if step == FAULT:
            model.fc2.bias.grad[1] = float("nan")
        for opt in opts:
            scaler.step(opt)
        scaler.update()
        if twin:
            other_opt.zero_grad()
            criterion(other(x), y).backward()
            other_opt.step()
    hook.close()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert smd.create_trial(out_dir).first_nonfinite() is None


def test_evaluation_steps_record_no_gradients(kernel, tmp_path):
    # An evaluation step runs no backward pass: the gradients still on the parameters are the last training
    # step's. Health on must not save them as the EVAL step's (a run without health saves none there).
    def run(out_dir, health):
        torch.manual_seed(0)
        model, criterion = Net(), nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hook = smd.Hook(
            out_dir=out_dir,
            health=health,
            save_config=smd.SaveConfig(save_interval=1),
            include_collections=["weights", "gradients", "losses"],
        )
        hook.register_module(model)
        hook.register_loss(criterion)
        x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        for _ in range(2):
            hook.set_mode(smd.modes.TRAIN)
            for _ in range(2):
                opt.zero_grad()
                criterion(model(x), y).backward()
                opt.step()
            hook.set_mode(smd.modes.EVAL)
            with torch.no_grad():
                criterion(model(x), y)
        hook.close()
        return smd.create_trial(out_dir)

    plain, healthy = run(str(tmp_path / "plain"), False), run(str(tmp_path / "health"), True)
    grad = "gradient/Net_fc1.weight"
    assert healthy.tensor(grad).steps(mode=smd.modes.EVAL) == []
    assert healthy.tensor(grad).steps() == plain.tensor(grad).steps() == [0, 1, 3, 4]
    assert healthy.tensor("Net_fc1.weight").steps(mode=smd.modes.EVAL) == [0, 1]  # mode steps


def test_native_kernel_values_against_torch(native_kernel):
    # each weight's, gradient's and the loss's l2 norm and max |x|, written into their columns (here in
    # reverse order): float32, float64 and bfloat16, non-contiguous, 0-d and empty tensors, NaN, inf,
    # finite values whose squares overflow float32, in small tensors and in large ones (read in blocks);
    # absent gradients (and all of them in evaluation): -1
    g = torch.Generator().manual_seed(3)
    weights = [
        torch.randn(70, 33, generator=g),
        torch.randn(5, 4, generator=g, dtype=torch.float64),
        torch.randn(6, 6, generator=g).to(torch.bfloat16),
        torch.randn(9, 7, generator=g).t(),
        torch.tensor(-2.5),
        torch.empty(0),
        torch.tensor([1.0, float("nan"), -3.0]),
        torch.tensor([float("-inf"), 2.0]),
        torch.full((4,), -3e30),
        -torch.randn(100, generator=g),
        torch.randn(5000, generator=g).index_fill_(0, torch.tensor([4321]), float("nan")),
        torch.randn(300, generator=g).index_fill_(0, torch.tensor([7]), float("-inf")),
        torch.randn(9000, generator=g) * 1e25,  # (some blocks' float32 sums of squares overflow)
    ]
    params = [nn.Parameter(torch.zeros(7)), nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(3))]
    params[0].grad = torch.randn(7, generator=g)
    params[2].grad = torch.tensor([0.0, float("inf"), 1.0])
    loss = torch.tensor(0.75, requires_grad=True) * 2
    tensors = [*weights, params[0].grad, None, params[2].grad, loss]
    n = len(tensors)
    columns = list(reversed(range(n)))
    watch = native.health_watch(weights, params, columns)
    for with_grads in (True, False):
        row = torch.empty(2 * n)
        with torch.no_grad():
            watch.fill(loss, with_grads, row)
        for i, t in enumerate(tensors):
            if t is None or not with_grads and len(weights) <= i < len(weights) + len(params):
                want = (-1.0, -1.0)
            else:
                t = t.detach().double()
                want = (t.norm().item(), t.abs().max().item() if t.numel() else 0.0)
            got = (row[columns[i]].item(), row[n + columns[i]].item())
            assert got == pytest.approx(want, rel=1e-6, nan_ok=True), (i, got, want)


@pytest.mark.parametrize("compiler", ["false", "no-such-compiler"])
def test_native_kernel_that_cannot_be_built_leaves_torchs_calls(tmp_path, monkeypatch, compiler):
    # a compiler that fails, or none: no kernel, nothing left in the cache, health still records
    monkeypatch.setenv("CXX", compiler)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    assert native._built() is None
    assert not list((tmp_path / "cache").rglob("*.so"))
    monkeypatch.setattr(native, "health_watch", lambda *args: None)
    _, seen = train(str(tmp_path / "run"), fault="gradient")
    first = smd.create_trial(str(tmp_path / "run")).first_nonfinite()
    assert (first["step"], first["tensor"]) == (FAULT, "gradient/Net_fc2.bias")


def test_a_weight_an_update_made_non_finite_is_named_with_the_module_it_breaks(out_dir):
    """The update of step 2 leaves inf in fc2's weight: at step 3, fc2's output is the first non-finite
    value (from finite inputs), and its own weight was non-finite as the step began."""
    model, criterion, hook = hooked_net(out_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        opt.zero_grad()
        criterion(model(torch.randn(8, 4, generator=g)), torch.randint(0, 3, (8,), generator=g)).backward()
        opt.step()
        if step == 2:
            with torch.no_grad():
                model.fc2.weight[1, 2] = float("inf")
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    assert (first["step"], first["direction"], first["module"], first["tensor"]) == (
        3,
        "forward",
        "fc2",
        "fc2_output_0",
    )
    assert first["parameters"] == ["Net_fc2.weight"]
    assert "its own parameters were already non-finite as the step began (Net_fc2.weight)" in why(out_dir)
