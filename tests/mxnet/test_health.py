"""Hook(health=True) with MXNet Gluon: every training step's statistics, the flight recorder written when
something goes wrong, and where the first non-finite value came from, with faults planted into real
Gluon training."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from contextlib import redirect_stdout
from io import StringIO

import mxnet as mx
import numpy as np
import pytest
from conftest import Run, batches, make_net
from mxnet import autograd, gluon
from support import first_loss_spike

import smdebug.mxnet as smd
from smdebug.cli import main as cli
from smdebug.exceptions import TensorUnavailableForStep

FAULT = 4
BATCH = 4


class Plant(gluon.Block):
    """Scales its input by a weight of its own; ``inf`` is added to its output when ``hit`` is set."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hit = False
        with self.name_scope():
            self.scale = self.params.get("scale", shape=(5,), init=mx.init.One())

    def forward(self, x):
        out = x * self.scale.data()
        out = out + np.inf if self.hit else out
        self.seen = (x, out)
        return out


def train(out_dir, fault=None, steps=8, input_fault=False, lr_jump_at=None, seen=None, at=FAULT, **hook_args):
    """Train a tiny net ``steps`` steps, its input batches in one buffer refilled in place; the l2 norm
    of each step's hidden weight as the hook saves it (after the step's update) and of its gradient.
    The fault is planted at step ``at``; ``seen``: filled with the tensors of that step as it left them; a collection "layers" names
    the model's input and the planted block's input and output."""
    mx.random.seed(0)
    with mx.name.NameManager():
        net = gluon.nn.Sequential()
        with net.name_scope():
            net.add(gluon.nn.Dense(5, activation="relu", in_units=4), Plant(), gluon.nn.Dense(3, in_units=5))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    net.initialize(mx.init.Xavier())
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=5), **hook_args)
    plant, hidden = net[1], net[0]
    if seen is not None:
        hook.get_collection("layers").add_block_tensors(net, inputs=True, outputs=False)
        hook.get_collection("layers").add_block_tensors(plant, inputs=True, outputs=True)
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    rng = np.random.RandomState(0)
    norms, grads = [], []
    batch = mx.nd.zeros((BATCH, 4))
    for step in range(steps):
        x = rng.randn(BATCH, 4).astype("float32")
        if input_fault and step == at:
            x[1, 2] = np.nan
        plant.hit = fault == "forward" and step == at
        batch[:] = x
        with autograd.record():
            loss = loss_fn(net(batch), mx.nd.array(rng.randint(0, 3, BATCH)))
        loss.backward()
        if fault == "gradient" and step == at:
            plant.scale.grad()[2] = np.nan
        grads.append(float(np.linalg.norm(hidden.weight.grad().asnumpy())))
        if step == lr_jump_at:
            trainer.set_learning_rate(trainer.learning_rate * 1e4)
        trainer.step(BATCH)
        norms.append(float(np.linalg.norm(hidden.weight.data().asnumpy())))
        if seen is not None and step == at:
            seen.update(
                {
                    net.name + "_input_0": x,
                    plant.name + "_input_0": plant.seen[0].asnumpy(),
                    plant.name + "_output_0": plant.seen[1].asnumpy(),
                    hidden.weight.name: hidden.weight.data().asnumpy(),
                    "gradient/" + hidden.weight.name: hidden.weight.grad().asnumpy(),
                    "gradient/" + plant.scale.name: plant.scale.grad().asnumpy(),
                    "loss": loss.asnumpy(),
                }
            )
    hook.close()
    return net, norms, grads


def hooked_hybrid(out_dir, net, loss_fn, save_interval=100, layer=None):
    """``net`` initialized, hooked with health (its loss block too) and hybridized; ``layer``: a block whose
    output the collection "layers" names. The hook and a Trainer of the net."""
    net.initialize(mx.init.Xavier())
    named = dict(include_collections=["losses", "layers"]) if layer is not None else {}
    hook = smd.Hook(
        out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=save_interval), **named
    )
    if layer is not None:
        hook.get_collection("layers").add_block_tensors(layer, outputs=True)
    hook.register_block(net)
    hook.register_block(loss_fn)
    net.hybridize()
    return hook, gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})


def why(out_dir, *args):
    buffer = StringIO()
    with redirect_stdout(buffer):
        assert cli(["why", *args, out_dir]) == 0
    return buffer.getvalue()


def test_healthy_run_writes_nothing_between_save_steps(out_dir):
    net, norms, grads = train(out_dir)
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 5]
    assert trial.first_nonfinite() is None
    weight = net[0].weight.name
    # a save step carries the step's statistics: the weight as the step left it, its gradient
    assert trial.tensor(weight).reduction_value(5, "l2") == pytest.approx(norms[5], rel=1e-5)
    assert trial.tensor("gradient/" + weight).reduction_value(5, "l2") == pytest.approx(grads[5], rel=1e-5)
    assert "Nothing was found" in why(out_dir)


@pytest.mark.parametrize(
    "fault, direction, where",
    [("forward", "forward", "plant"), ("gradient", "backward", "plant"), ("input", "input", "model")],
)
def test_first_nonfinite_names_where_it_appeared(out_dir, fault, direction, where):
    net, norms, grads = train(out_dir, fault=fault, input_fault=fault == "input")
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert first is not None
    block = net[1] if where == "plant" else net
    tensor = {
        "forward": f"{block.name}_output_0",
        "backward": f"gradient/{net[1].scale.name}",
        "input": f"{block.name}_input_0",
    }[direction]
    assert {k: first[k] for k in ("step", "mode", "direction", "module", "tensor", "worker")} == {
        "step": FAULT,
        "mode": "GLOBAL",
        "direction": direction,
        "module": block.name,
        "tensor": tensor,
        "worker": "worker_0",
    }
    # the recorder's rows of the steps before, as ordinary reductions of their own steps
    weight = net[0].weight.name
    loss = trial.tensor_names(collection="losses")[0]
    for step in range(FAULT):
        assert trial.tensor(weight).reduction_value(step, "l2") == pytest.approx(norms[step], rel=1e-5)
        grad = trial.tensor("gradient/" + weight).reduction_value(step, "l2")
        assert grad == pytest.approx(grads[step], rel=1e-5)
        assert np.isfinite(trial.tensor(loss).reduction_value(step, "max", abs=True))
    bad = "gradient/" + (net[0].weight.name if fault == "input" else net[1].scale.name)
    assert not np.isfinite(trial.tensor(bad).reduction_value(FAULT, "l2"))
    assert json.loads(why(out_dir, "--json"))["tensor"] == tensor


@pytest.mark.parametrize("fault", ["gradient", "forward"])
def test_a_trigger_saves_the_steps_tensors_the_collections_name(out_dir, fault):
    """The first non-finite value at a step that is not a save step: that step's weights, gradients,
    loss and the layer tensors a collection names are in the run, with the values the step had."""
    seen = {}
    net, _, _ = train(
        out_dir, fault=fault, seen=seen, include_collections=["weights", "gradients", "losses", "layers"]
    )
    trial = smd.create_trial(out_dir)
    assert trial.first_nonfinite()["step"] == FAULT
    assert FAULT % 5 != 0  # not a step of the save interval
    weight = net[0].weight.name
    with pytest.raises(TensorUnavailableForStep):  # the recorder's steps before: reductions only
        trial.tensor(weight).value(FAULT - 1)
    seen[trial.tensor_names(collection="losses")[0]] = seen.pop("loss")
    for name, value in seen.items():
        saved = trial.tensor(name).value(FAULT)
        np.testing.assert_array_equal(saved, value, err_msg=name)  # (NaN where NaN)
    plant = net[1]
    if fault == "gradient":  # NaN planted into one value of the scale's gradient
        grad = trial.tensor("gradient/" + plant.scale.name).value(FAULT)
        assert np.isnan(grad).tolist() == [False, False, True, False, False]
        assert np.isfinite(trial.tensor(plant.name + "_output_0").value(FAULT)).all()
    else:  # inf added to the planted block's output
        assert np.isposinf(trial.tensor(plant.name + "_output_0").value(FAULT)).all()
        assert np.isfinite(trial.tensor(plant.name + "_input_0").value(FAULT)).all()
    # the model's input is the step's batch, although its buffer was refilled before the step was judged
    assert not np.array_equal(trial.tensor(net.name + "_input_0").value(5), seen[net.name + "_input_0"])


def test_a_fault_at_a_save_step_is_named_as_the_step_saves_it(out_dir):
    """At a save step the hook has numbered the block tensors it saves: the provenance names the saved
    tensor (its numbering is the step's own, not continued after the hook's)."""
    seen = {}
    net, _, _ = train(
        out_dir,
        fault="forward",
        at=5,
        seen=seen,
        include_collections=["weights", "gradients", "losses", "layers"],
    )
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["tensor"]) == (5, net[1].name + "_output_0")
    assert np.isposinf(trial.tensor(first["tensor"]).value(5)).all()
    assert trial.tensor_names(regex="_output_1$") == []


def test_rows_read_a_step_late_on_a_gpu_still_name_the_first_nonfinite(out_dir, monkeypatch):
    """On a GPU the row is read when the next step is recorded (no wait for the device): that path, run
    on the CPU, finds the same place and writes the same recorder."""
    from smdebug_mxnet import health

    monkeypatch.setattr(health, "reads_late", lambda ctx: True)
    net, norms, _ = train(out_dir, fault="gradient")
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (
        FAULT,
        "backward",
        "gradient/" + net[1].scale.name,
    )
    weight = net[0].weight.name
    for step in range(FAULT):
        assert trial.tensor(weight).reduction_value(step, "l2") == pytest.approx(norms[step], rel=1e-5)


class HybridPlant(gluon.HybridBlock):
    """exp of its scaled input: inf from a finite but large input (inside a hybridized graph a Python
    flag would be read only once, when the graph is built)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.scale = self.params.get("scale", shape=(5,), init=mx.init.One())

    def hybrid_forward(self, F, x, scale):
        return F.exp(F.broadcast_mul(x, scale))


def test_a_fault_inside_a_hybridized_model_is_named_at_its_inner_block(out_dir):
    mx.random.seed(0)
    with mx.name.NameManager():
        net = gluon.nn.HybridSequential()
        with net.name_scope():
            net.add(
                gluon.nn.Dense(5, activation="relu", in_units=4),
                HybridPlant(),
                gluon.nn.Dense(3, in_units=5),
            )
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    hook, trainer = hooked_hybrid(out_dir, net, loss_fn, save_interval=5)
    rng = np.random.RandomState(0)
    plant = net[1]
    for step in range(8):
        x = rng.randn(BATCH, 4).astype("float32") * (1e3 if step == FAULT else 0.1)  # finite either way
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(rng.randint(0, 3, BATCH)))
        loss.backward()
        trainer.step(BATCH)
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    assert {k: first[k] for k in ("step", "direction", "module", "tensor")} == {
        "step": FAULT,
        "direction": "forward",
        "module": plant.name,
        "tensor": f"{plant.name}_output_0",
    }


def test_a_loss_spike_from_a_learning_rate_jump_writes_the_recorder(out_dir):
    net, norms, grads = train(
        out_dir, steps=12, lr_jump_at=8, health_loss_factor=3, include_collections=["weights", "gradients"]
    )
    trial = smd.create_trial(out_dir)
    spike = first_loss_spike(trial)
    assert spike == 9  # the loss of the step after the jump (not a save step)
    weight = net[0].weight.name
    for step in range(1, spike):
        assert trial.tensor(weight).reduction_value(step, "l2") == pytest.approx(norms[step], rel=1e-5)
    assert trial.tensor("gradient/" + weight).reduction_value(spike, "l2") == pytest.approx(
        grads[spike], rel=1e-5
    )
    # the spike's step's raw tensors, as the collections name them, although it is not a save step
    assert np.linalg.norm(trial.tensor(weight).value(spike)) == pytest.approx(norms[spike], rel=1e-5)
    assert np.linalg.norm(trial.tensor("gradient/" + weight).value(spike)) == pytest.approx(
        grads[spike], rel=1e-5
    )
    with pytest.raises(TensorUnavailableForStep):
        trial.tensor(weight).value(spike - 1)


def test_a_loss_spike_early_in_training_is_caught_at_its_step(out_dir):
    """A spike right after the first few steps of history (5) is judged at once, not only once the
    median is first due for its periodic update (every 10 steps)."""
    train(out_dir, steps=8, lr_jump_at=5)
    assert first_loss_spike(smd.create_trial(out_dir)) == 6


ENDS = textwrap.dedent(
    """
    import sys, time
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon
    import smdebug.mxnet as smd

    out, how = sys.argv[1], sys.argv[2]
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(5, activation="relu"), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    hook = smd.Hook(
        out_dir=out,
        health=True,
        save_config=smd.SaveConfig(save_interval=100),
        include_collections=["weights", "gradients", "losses"],
    )
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    for step in range(4):
        with autograd.record():
            loss = loss_fn(net(mx.nd.ones((4, 4)) * step), mx.nd.array([0, 1, 2, 0]))
        loss.backward()
        trainer.step(4)
    np.save(out + ".npy", net[0].weight.grad().asnumpy())
    if how == "raise":
        raise RuntimeError("training failed")
    print("waiting", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("how", ["raise", "SIGTERM"])
def test_training_that_raises_or_is_terminated_saves_its_last_steps_tensors(tmp_path, how):
    """The last step of a run that raises or gets SIGTERM is not a save step: the recorder is written
    and that step's tensors the collections name are saved as well, as for any other trigger."""
    out = str(tmp_path / "run")
    script = tmp_path / "train.py"
    script.write_text(ENDS)
    proc = subprocess.Popen(
        [sys.executable, str(script), out, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if how == "SIGTERM":
        assert proc.stdout.readline().strip() == "waiting"
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err
    trial = smd.create_trial(out)
    (record,) = trial.health_records()
    assert [t["step"] for t in record["triggers"]] == [3], record
    assert trial.first_nonfinite() is None
    weight = trial.tensor_names(collection="weights")[0]
    assert trial.tensor(weight).reduction_value(2, "l2") > 0  # the recorder's steps before
    grad = trial.tensor("gradient/" + weight).value(3)
    np.testing.assert_allclose(grad, np.load(out + ".npy"), rtol=1e-6)
    loss = trial.tensor_names(collection="losses")[0]
    assert trial.tensor(loss).value(3).shape == (4,)


@pytest.mark.parametrize("hybridize", [False, True])
def test_evaluation_steps_are_watched_too(out_dir, hybridize):
    """EVAL steps are recorded (weights and loss; no gradients) without a false alarm, and an inf in a
    validation batch is named with its step and mode."""
    net, loss_fn = make_net(hybridize)
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_block(net)
    hook.register_block(loss_fn)
    run = Run(hook, net, loss_fn)
    data = batches(4)
    hook.set_mode(smd.modes.TRAIN)
    run.train(data[:3])
    hook.set_mode(smd.modes.EVAL)
    run.evaluate(data)
    bad = data[3][0].copy()
    bad[2, 1] = np.inf  # (MXNet's relu Activation turns NaN into 0: a NaN would not reach the loss)
    run.evaluate([(bad, data[3][1])])
    hook.set_mode(smd.modes.TRAIN)
    run.train(data[:2])
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert {k: first[k] for k in ("step", "mode", "direction", "module", "tensor")} == {
        "step": 7,
        "mode": "EVAL",
        "direction": "input",
        "module": net.name,
        "tensor": net.name + "_input_0",
    }
    assert first["mode_step"] == 4
    weight = net[0].weight.name
    # the recorder's EVAL steps: weights and loss, no gradients
    loss = trial.tensor_names(collection="losses")[0]
    for step, seen in zip(range(3, 7), run.seen[3:7]):
        l2 = trial.tensor(weight).reduction_value(step, "l2", mode=smd.modes.GLOBAL)
        assert l2 == pytest.approx(np.linalg.norm(seen[weight]), rel=1e-5)
        peak = trial.tensor(loss).reduction_value(step, "max", abs=True, mode=smd.modes.GLOBAL)
        assert peak == pytest.approx(np.abs(seen["loss"]).max(), rel=1e-5)
    assert 4 not in trial.tensor("gradient/" + weight).steps()
    assert trial.tensor(weight).steps(mode=smd.modes.EVAL) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("unfreeze", [False, True])
def test_a_layer_frozen_during_training_keeps_the_others_watched(out_dir, unfreeze):
    """grad_req set to 'null' mid-run (fine-tuning): the recorder follows the parameters that still
    have gradients instead of failing at every later step; a layer trained again is watched again."""
    net, loss_fn = make_net()
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    for step, (x, y) in enumerate(batches(7)):
        if step == (0 if unfreeze else 3):
            net[0].collect_params().setattr("grad_req", "null")
        if unfreeze and step == 3:
            net[0].collect_params().setattr("grad_req", "write")
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if step == 5:
            net[0 if unfreeze else 1].weight.grad()[0, 0] = np.nan
        trainer.step(BATCH)
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    bad = net[0 if unfreeze else 1].weight.name
    assert (first["step"], first["direction"], first["tensor"]) == (5, "backward", f"gradient/{bad}")
    assert np.isfinite(trial.tensor(net[0].weight.name).reduction_value(4, "l2"))
    assert (4 in trial.tensor(f"gradient/{net[0].weight.name}").steps()) == unfreeze


class Exp(gluon.HybridBlock):
    """exp of its input times one: both operators may run in place, in the buffer of the block before."""

    def hybrid_forward(self, F, x):
        return F.exp(x * 1.0)


def test_a_hybridized_layer_is_judged_by_its_own_output_not_by_a_later_one_in_its_buffer(out_dir):
    """Inside a cached graph MXNet reuses a node's buffer (in place, or for a later node): the output of
    the layer before the faulty one was finite when it was computed, and is not named."""
    mx.random.seed(0)
    with mx.name.NameManager():
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(5, in_units=4), Exp(), gluon.nn.Dense(3, in_units=5))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    hook, trainer = hooked_hybrid(out_dir, net, loss_fn, layer=net[0])
    rng = np.random.RandomState(0)
    for step in range(6):
        x = mx.nd.array(rng.randn(BATCH, 4) * (1e4 if step == FAULT else 0.1))  # finite either way
        with autograd.record():
            loss = loss_fn(net(x), mx.nd.array(rng.randint(0, 3, BATCH)))
        loss.backward()
        if step == FAULT:
            weight, bias = net[0].weight.data().asnumpy(), net[0].bias.data().asnumpy()
            dense = x.asnumpy() @ weight.T + bias
        trainer.step(BATCH)
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["module"], first["tensor"]) == (
        FAULT,
        "forward",
        net[1].name,
        f"{net[1].name}_output_0",
    )
    # the trigger saves the layer's output as the layer computed it
    saved = trial.tensor(f"{net[0].name}_output_0").value(FAULT)
    np.testing.assert_allclose(saved, dense, rtol=1e-5)


def test_a_validation_loss_far_above_the_training_loss_is_no_loss_spike(out_dir):
    """An overfit model's validation loss is many times its training loss: a loss spike is judged among
    training steps only."""
    net, loss_fn = make_net()
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    (x, y), (_, other) = batches(2)
    for _ in range(3):
        hook.set_mode(smd.modes.TRAIN)
        for _ in range(8):
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(BATCH)
        hook.set_mode(smd.modes.EVAL)
        for _ in range(3):
            validation = loss_fn(net(x), (y + 1) % 3).mean().asscalar()
    assert validation > 30 * loss.mean().asscalar()
    hook.close()
    (record,) = smd.create_trial(out_dir).health_records()
    assert record["triggers"] == []


@pytest.mark.parametrize("hybridize", [False, True])
def test_a_weight_set_to_inf_before_a_step_is_named_at_that_steps_forward(out_dir, hybridize):
    """A weight set to inf between two steps is named where it first shows in what a step computes: the
    output of its layer in the next step's forward pass (as torch names it)."""
    net, loss_fn = make_net(hybridize)
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    for step, (x, y) in enumerate(batches(7)):
        if step == FAULT:
            net[1].bias.set_data(mx.nd.full((3,), np.inf))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(BATCH)
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    assert {k: first[k] for k in ("step", "direction", "module", "tensor")} == {
        "step": FAULT,
        "direction": "forward",
        "module": net[1].name,
        "tensor": f"{net[1].name}_output_0",
    }
    assert f"in the forward pass: the output of module {net[1].name}" in why(out_dir)


def test_weights_made_inf_by_the_last_update_are_named_when_the_hook_closes(out_dir):
    """Finite gradients, but the last update overflowed (a learning rate of 3e38 on gradients scaled by a
    thousand): the weights are the first non-finite values; no later step shows them, so closing names
    them."""
    net, loss_fn = make_net()
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    for step, (x, y) in enumerate(batches(3)):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if step == 2:
            trainer.set_learning_rate(3e38)
        trainer.step(BATCH if step < 2 else 1e-3)
    hook.close()
    first = smd.create_trial(out_dir).first_nonfinite()
    assert (first["step"], first["direction"]) == (2, "backward")
    assert first["tensor"] in {p.name for p in net.collect_params().values()}


def test_training_that_raises_inside_try_finally_saves_its_last_steps_tensors(out_dir):
    net, loss_fn = make_net()
    hook = smd.Hook(
        out_dir=out_dir,
        health=True,
        save_config=smd.SaveConfig(save_interval=100),
        include_collections=["weights", "gradients", "losses"],
    )
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with pytest.raises(RuntimeError):
        try:
            for step, (x, y) in enumerate(batches(5)):
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                trainer.step(BATCH)
                if step == 3:
                    grad = net[0].weight.grad().asnumpy()
                    raise RuntimeError("data loader failed")
        finally:
            hook.close()
    trial = smd.create_trial(out_dir)
    (record,) = trial.health_records()
    assert [(t["step"], t["reason"].startswith("training raised")) for t in record["triggers"]] == [(3, True)]
    np.testing.assert_array_equal(trial.tensor(f"gradient/{net[0].weight.name}").value(3), grad)


def test_two_registered_models_are_watched_together(out_dir):
    """An encoder and a head registered as two models (each forward starts a step, as in smdebug 1.0):
    the recorder watches both models' parameters at every step and keeps its history."""
    mx.random.seed(0)
    with mx.name.NameManager():
        encoder, head = gluon.nn.Dense(6, activation="relu"), gluon.nn.Dense(3)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    encoder.initialize()
    head.initialize()
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    for block in (encoder, head, loss_fn):
        hook.register_block(block)
    params = {**encoder.collect_params(), **head.collect_params()}
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.1})
    for i, (x, y) in enumerate(batches(5)):
        with autograd.record():
            loss = loss_fn(head(encoder(x)), y)
        loss.backward()
        if i == 3:
            encoder.weight.grad()[0, 0] = np.nan
        trainer.step(BATCH)
    hook.close()
    trial = smd.create_trial(out_dir)
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["module"], first["tensor"]) == (
        7,
        "backward",
        encoder.name,
        f"gradient/{encoder.weight.name}",
    )
    for step in range(1, 7):
        for param in (encoder.weight, head.weight):
            assert np.isfinite(trial.tensor(f"gradient/{param.name}").reduction_value(step, "l2"))


def test_a_trigger_saves_a_hybridized_layer_whose_output_is_its_activations(out_dir):
    """A Dense with an activation: inside a cached graph its output is its relu child's; a trigger saves
    it under the Dense's name as well, as a save step does."""
    mx.random.seed(0)
    with mx.name.NameManager():
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(5, activation="relu", in_units=4), gluon.nn.Dense(3, in_units=5))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    hook, trainer = hooked_hybrid(out_dir, net, loss_fn, layer=net[0])
    for step, (x, y) in enumerate(batches(6, seed=2)):
        x = x[:, :4]
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if step == FAULT:
            weight, bias = net[0].weight.data().asnumpy(), net[0].bias.data().asnumpy()
            hidden = np.maximum(x.asnumpy() @ weight.T + bias, 0)
            net[1].weight.grad()[0, 0] = np.nan
        trainer.step(BATCH)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.first_nonfinite()["step"] == FAULT
    saved = trial.tensor(f"{net[0].name}_output_0").value(FAULT)
    np.testing.assert_allclose(saved, hidden, rtol=1e-5, atol=1e-7)


def test_an_integer_layer_output_in_a_hybridized_model_is_no_error(out_dir, capfd):
    mx.random.seed(0)
    with mx.name.NameManager():
        net = gluon.nn.HybridSequential()
        inner = gluon.nn.HybridSequential()
        inner.add(gluon.nn.HybridLambda(lambda F, x: F.cast(x * 4, dtype="int32")))
        net.add(inner, gluon.nn.HybridLambda(lambda F, x: F.cast(x, dtype="float32")), gluon.nn.Dense(3))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    hook, trainer = hooked_hybrid(out_dir, net, loss_fn)
    for step, (x, y) in enumerate(batches(4)):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if step == 2:
            net[2].weight.grad()[0, 0] = np.nan
        trainer.step(BATCH)
    hook.close()
    assert "Traceback" not in capfd.readouterr().err
    first = smd.create_trial(out_dir).first_nonfinite()
    assert (first["step"], first["tensor"]) == (2, f"gradient/{net[2].weight.name}")


@pytest.mark.parametrize("per_layer", [False, True])
def test_gradient_accumulation_records_the_gradients_before_zero_grad(out_dir, per_layer):
    """grad_req 'add', three forward/backward passes (three steps) a trainer.step, then zero_grad: the
    last pass's step is recorded before the gradients are zeroed (the next forward would see zeros), so
    a NaN in the accumulated gradient is named there and the recorder holds the real norms; with one
    Trainer a layer too (neither update covers the model: zero_grad records the step)."""
    net, loss_fn = make_net()
    for param in net.collect_params().values():
        param.grad_req = "add"
    hook = smd.Hook(
        out_dir=out_dir,
        health=True,
        save_config=smd.SaveConfig(save_interval=100),
        include_collections=["gradients", "losses"],
    )
    hook.register_block(net)
    hook.register_block(loss_fn)
    parts = list(net) if per_layer else [net]
    trainers = [gluon.Trainer(part.collect_params(), "sgd", {"learning_rate": 0.1}) for part in parts]
    data = batches(12)
    norms = []
    for i in range(4):
        for x, y in data[3 * i : 3 * i + 3]:
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
        if i == 2:
            net[1].weight.grad()[0, 0] = np.nan
        norms.append(float(np.linalg.norm(net[1].weight.grad().asnumpy())))
        if i == 2:
            planted = net[1].weight.grad().asnumpy()
        for trainer in trainers:
            trainer.step(3 * BATCH)
        net.collect_params().zero_grad()
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.health_records()[0]["triggers"][0]["reason"].startswith("non-finite"), trial.health_records()
    first = trial.first_nonfinite()
    assert (first["step"], first["direction"], first["tensor"]) == (
        8,
        "backward",
        f"gradient/{net[1].weight.name}",
    )
    grad = trial.tensor(f"gradient/{net[1].weight.name}")
    assert grad.reduction_value(5, "l2") == pytest.approx(norms[1], rel=1e-5)
    np.testing.assert_array_equal(grad.value(8), planted)  # the trigger's save, before zero_grad


def test_a_trigger_at_the_save_step_before_the_first_evaluation_saves_that_steps_gradients(out_dir):
    """smdebug 1.0.34 saves no parameters for the last TRAIN step before the first evaluation (it reads
    them when the next step starts, in EVAL): a trigger at that step saves them all the same, once."""
    net, loss_fn = make_net()
    hook = smd.Hook(
        out_dir=out_dir,
        health=True,
        save_config=smd.SaveConfig(save_interval=5),
        include_collections=["weights", "gradients", "losses"],
    )
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    data = batches(7)
    hook.set_mode(smd.modes.TRAIN)
    for step, (x, y) in enumerate(data[:6]):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if step == 5:
            net[1].weight.grad()[0, 0] = np.nan
            planted = net[1].weight.grad().asnumpy()
        trainer.step(BATCH)
    hook.set_mode(smd.modes.EVAL)
    loss_fn(net(data[6][0]), data[6][1])
    hook.close()
    trial = smd.create_trial(out_dir)
    name = f"gradient/{net[1].weight.name}"
    assert trial.first_nonfinite()["tensor"] == name
    np.testing.assert_array_equal(trial.tensor(name).value(5, mode=smd.modes.TRAIN), planted)
    with open(os.path.join(out_dir, "index", "000000000", f"{5:012d}_worker_0.json")) as f:
        names = [t["tensorname"] for t in json.load(f)["tensor_payload"]]
    assert name in names and len(names) == len(set(names))


def test_two_trainers_updating_one_model_record_its_step_after_both(out_dir):
    """Each layer of the model has its own Trainer: the step is recorded once both updated their
    weights (the first trainer.step alone covers half of them), as the hook saves them."""
    net, loss_fn = make_net()
    hook = smd.Hook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainers = [gluon.Trainer(layer.collect_params(), "sgd", {"learning_rate": 0.5}) for layer in net]
    norms = []
    for step, (x, y) in enumerate(batches(4)):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if step == 3:  # (a trigger, so that the recorder is written)
            net[0].bias.grad()[0] = np.nan
        for trainer in trainers:
            trainer.step(BATCH)
        norms.append(float(np.linalg.norm(net[1].weight.data().asnumpy())))
    hook.close()
    trial = smd.create_trial(out_dir)
    recorded = [trial.tensor(net[1].weight.name).reduction_value(step, "l2") for step in (0, 1, 2)]
    assert recorded == pytest.approx(norms[:3], rel=1e-5)
