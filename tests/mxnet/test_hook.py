"""The MXNet hook on real Gluon training: names, steps, modes and values of what it saves."""

from __future__ import annotations

import itertools
import json
import logging

import mxnet as mx
import numpy as np
import pytest
from conftest import Run, batches, make_net
from support import NUMPY_REDUCTIONS

import smdebug.mxnet as smd
import smdebug_mxnet
from smdebug.exceptions import TensorUnavailableForStep
from smdebug.trials import create_trial

PARAMS = ["dense0_bias", "dense0_weight", "dense1_bias", "dense1_weight"]
GRADS = [f"gradient/{p}" for p in PARAMS]
LOSS = "softmaxcrossentropyloss0_output_0"


def _hook(out_dir, net, loss_fn, **kwargs):
    hook = smd.Hook(out_dir, **kwargs)
    hook.register_block(net)
    hook.register_block(loss_fn)
    return hook


def test_alias_is_the_plugin_package():
    assert smd is smdebug_mxnet
    assert smd.Hook.__module__ == "smdebug_mxnet.hook"
    assert smd.modes.TRAIN.name == "TRAIN"


def test_default_config_saves_the_losses_only(out_dir):
    net, loss_fn = make_net()
    hook = _hook(out_dir, net, loss_fn)
    run = Run(hook, net, loss_fn)
    run.train(batches(3))
    hook.close()

    trial = create_trial(out_dir)
    assert trial.tensor_names() == [LOSS]
    assert trial.steps() == [0]  # every 500 steps by default
    assert trial.tensor_names(collection="losses") == [LOSS]
    np.testing.assert_allclose(trial.tensor(LOSS).value(0), run.seen[0]["loss"], rtol=1e-6)


def test_only_blocks_whose_tensors_are_wanted_carry_a_forward_hook(out_dir):
    """A forward hook is a call at every step: a model's blocks get one once a collection may hold their
    inputs or outputs, from the next step on."""
    net, loss_fn = make_net()
    hook = _hook(out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=1))
    run = Run(hook, net, loss_fn)
    run.train(batches(2))
    blocks = [net, net[0], net[0].act, net[1], loss_fn]
    assert [len(b._forward_hooks) for b in blocks] == [1, 0, 0, 0, 1]
    hook.get_collection("losses").add_block_tensors(net[0], outputs=True)
    run.train(batches(2))
    hook.close()

    assert [len(b._forward_hooks) for b in blocks] == [1, 1, 0, 0, 1]
    trial = create_trial(out_dir)
    assert sorted(trial.tensor_names()) == ["dense0_output_0", LOSS]
    assert trial.tensor("dense0_output_0").steps() == [2, 3]
    for step in (2, 3):
        hidden = np.maximum(
            run.seen[step]["input"] @ run.seen[step - 1]["dense0_weight"].T
            + run.seen[step - 1]["dense0_bias"],
            0,
        )
        np.testing.assert_allclose(trial.tensor("dense0_output_0").value(step), hidden, rtol=1e-5, atol=1e-6)


def test_idle_steps_run_without_forward_hooks(out_dir):
    """Between steps that save nothing the model and loss blocks carry no forward hook; a step that saves
    something has them again."""
    net, loss_fn = make_net()
    hook = _hook(out_dir, net, loss_fn, save_config=smd.SaveConfig(save_steps=[0, 3]))
    run = Run(hook, net, loss_fn)
    run.train(batches(3))
    assert not net._forward_hooks and not loss_fn._forward_hooks
    run.train(batches(2, seed=2))
    hook.close()

    trial = create_trial(out_dir)
    assert trial.tensor_names() == [LOSS] and trial.steps() == [0, 3]
    for step in (0, 3):
        np.testing.assert_allclose(trial.tensor(LOSS).value(step), run.seen[step]["loss"], rtol=1e-6)


def test_weights_and_gradients_as_of_the_steps_update(out_dir):
    net, loss_fn = make_net()
    colls = ["weights", "biases", "gradients", "losses"]
    hook = _hook(
        out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=2), include_collections=colls
    )
    run = Run(hook, net, loss_fn)
    run.train(batches(5))
    hook.close()

    trial = create_trial(out_dir)
    assert trial.steps() == [0, 2, 4]
    assert sorted(trial.tensor_names()) == sorted([*PARAMS, *GRADS, LOSS])
    assert sorted(trial.tensor_names(collection="weights")) == ["dense0_weight", "dense1_weight"]
    assert sorted(trial.tensor_names(collection="biases")) == ["dense0_bias", "dense1_bias"]
    assert sorted(trial.tensor_names(collection="gradients")) == GRADS
    for step in (0, 2, 4):  # the last step too: saved when the hook closes
        for name in [*PARAMS, *GRADS, "loss"]:
            saved = trial.tensor(LOSS if name == "loss" else name).value(step)
            np.testing.assert_allclose(saved, run.seen[step][name], rtol=1e-6, err_msg=f"{name} {step}")
    # the weights saved at a step are the ones its update produced, not the ones it started from
    assert not np.allclose(trial.tensor("dense0_weight").value(2), run.seen[1]["dense0_weight"])


def test_modes_and_the_steps_at_a_mode_change(out_dir):
    """As smdebug 1.0.34: a step's parameters are read when the next step starts, so after a mode change
    the new mode's configuration decides, at that mode's latest step (none yet: not due) and without
    gradients in EVAL."""
    net, loss_fn = make_net()
    colls = ["weights", "gradients", "losses"]
    hook = _hook(
        out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=1), include_collections=colls
    )
    run = Run(hook, net, loss_fn)
    data = batches(8)
    hook.set_mode(smd.modes.TRAIN)
    run.train(data[:3])  # global steps 0-2
    hook.set_mode(smd.modes.EVAL)
    run.evaluate(data[3:5])  # 3-4
    hook.set_mode(smd.modes.TRAIN)
    run.train(data[5:7])  # 5-6
    hook.set_mode(smd.modes.EVAL)
    run.evaluate(data[7:])  # 7
    hook.close()

    trial = create_trial(out_dir)
    assert trial.steps() == list(range(8))
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2, 3, 4]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 1, 2]
    weight = trial.tensor("dense1_weight")
    assert weight.steps() == [0, 1, 3, 4, 5, 6, 7]  # 2: EVAL had no step yet when it was read
    assert weight.steps(mode=smd.modes.EVAL) == [0, 1, 2]
    gradient = trial.tensor("gradient/dense1_weight")
    assert gradient.steps() == [0, 1, 4, 5]  # 4: read as TRAIN resumed; 6: read in EVAL; 7: EVAL
    assert gradient.steps(mode=smd.modes.EVAL) == [1]
    for step in weight.steps():
        np.testing.assert_allclose(weight.value(step), run.seen[step]["dense1_weight"], rtol=1e-6)
    for step in (0, 1, 5):
        np.testing.assert_allclose(gradient.value(step), run.seen[step]["gradient/dense1_weight"], rtol=1e-6)
    # the gradients filed under EVAL step 1 are the last ones computed, those of TRAIN step 2
    np.testing.assert_allclose(gradient.value(4), run.seen[2]["gradient/dense1_weight"], rtol=1e-6)
    for step in range(8):
        np.testing.assert_allclose(trial.tensor(LOSS).value(step), run.seen[step]["loss"], rtol=1e-6)


def test_block_tensors_and_include_regex(out_dir):
    net, loss_fn = make_net()
    hook = smd.Hook(
        out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["first", "losses"],
        include_regex=["dense1_output_.*"],
    )
    hook.get_collection("first").add_block_tensors(net[0], inputs=True, outputs=True)
    hook.get_collection("loss_in").add_block_tensors(loss_fn, inputs=True, outputs=False)
    hook.register_block(net)
    hook.register_block(loss_fn)
    run = Run(hook, net, loss_fn)
    run.train(batches(2))
    hook.close()

    trial = create_trial(out_dir)
    assert sorted(trial.tensor_names()) == ["dense0_input_0", "dense0_output_0", "dense1_output_0", LOSS]
    assert sorted(trial.tensor_names(collection="first")) == ["dense0_input_0", "dense0_output_0"]
    assert trial.tensor_names(collection="default") == ["dense1_output_0"]
    for step in (0, 1):
        np.testing.assert_allclose(trial.tensor("dense0_input_0").value(step), run.seen[step]["input"])
        np.testing.assert_allclose(
            trial.tensor("dense1_output_0").value(step), run.seen[step]["output"], rtol=1e-6
        )
        hidden = run.seen[step]["input"] @ run.seen[step - 1]["dense0_weight"].T if step else None
        if hidden is not None:  # dense0 ran with the previous step's updated weights
            hidden = np.maximum(hidden + run.seen[step - 1]["dense0_bias"], 0)
            np.testing.assert_allclose(
                trial.tensor("dense0_output_0").value(step), hidden, rtol=1e-5, atol=1e-6
            )


def test_block_tensors_are_read_at_the_steps_end_with_the_values_they_had(out_dir):
    """Block tensors are read when the step ends (no wait in the middle of a step): an input buffer the
    script refills for the next batch before the next forward is saved as it was when the block saw it;
    a flush or set_mode ending the step saves them into that step."""
    from mxnet import autograd

    net, loss_fn = make_net()
    hook = smd.Hook(
        out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["first", "losses"]
    )
    hook.get_collection("first").add_block_tensors(net, inputs=True, outputs=False)
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    data = batches(3)
    buffer = mx.nd.zeros(data[0][0].shape)
    losses = []
    for step, (x, y) in enumerate(data):
        buffer[:] = x  # one input buffer, refilled in place for every batch
        with autograd.record():
            loss = loss_fn(net(buffer), y)
        loss.backward()
        trainer.step(4)
        losses.append(loss.asnumpy().copy())
        if step == 1:
            hook.flush()  # ends step 1: what it saw is saved into it
    hook.set_mode(smd.modes.EVAL)
    hook.close()

    trial = create_trial(out_dir)
    input_name = f"{net.name}_input_0"
    for step, (x, _) in enumerate(data):
        np.testing.assert_array_equal(trial.tensor(input_name).value(step), x.asnumpy())
        np.testing.assert_array_equal(trial.tensor(LOSS).value(step), losses[step])
    assert trial.steps() == [0, 1, 2]


def _train_all(out_dir, hybridize, register_first=True, static=False):
    net, loss_fn = make_net(hybridize)
    if static:
        net.hybridize(static_alloc=True, static_shape=True)
    data = batches(3)
    if not register_first:
        net(data[0][0])  # the graph is built before the hook is registered
    hook = _hook(out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=1), save_all=True)
    Run(hook, net, loss_fn).train(data)
    hook.close()
    return create_trial(out_dir)


def test_hybridized_layers_are_saved_as_without_hybridize(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        plain = _train_all(str(tmp_path / "plain"), hybridize=False)
    assert not caplog.records  # deferred initialisation builds graphs too: no false alarm
    hybrid = _train_all(str(tmp_path / "hybrid"), hybridize=True)
    names = sorted(plain.tensor_names())
    assert {"dense0_relu_output_0", "dense1_input_0", "dense0_input_0", *PARAMS, *GRADS} <= set(names)
    assert sorted(hybrid.tensor_names()) == names
    assert hybrid.steps() == plain.steps() == [0, 1, 2]
    for name in names:
        for step in plain.tensor(name).steps():
            np.testing.assert_allclose(
                hybrid.tensor(name).value(step),
                plain.tensor(name).value(step),
                rtol=1e-5,
                atol=1e-6,
                err_msg=name,
            )


class _Positions(mx.gluon.HybridBlock):
    """A child given a parameter of its parent (a learned table), another an operator without inputs
    (F.ones), and one returning its own parameter: inside the cached graph, none is a graph input."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.table = self.params.get("table", shape=(4, 5))
            self.a = mx.gluon.nn.Dense(3, in_units=5)
            self.b = mx.gluon.nn.Dense(3, in_units=5)
            self.c = mx.gluon.nn.Dense(3, in_units=5)

    def hybrid_forward(self, F, x, table):
        return self.a(x) + self.b(table) + self.c(F.ones((4, 5)))


def test_a_hybridized_childs_parameter_or_constant_input_is_saved_as_without_hybridize(tmp_path, caplog):
    def train(out_dir, hybridize):
        mx.random.seed(0)
        net = _Positions(prefix="net_")
        net.initialize(mx.init.Xavier())
        if hybridize:
            net.hybridize()
        hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["c"])
        hook.get_collection("c").include([r"dense\d_input_0"])
        hook.register_block(net)
        for step in range(2):
            net(mx.nd.ones((4, 5)) * step)
        hook.close()
        return create_trial(out_dir)

    plain = train(str(tmp_path / "plain"), hybridize=False)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hybrid = train(str(tmp_path / "hybrid"), hybridize=True)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    names = ["net_dense0_input_0", "net_dense1_input_0", "net_dense2_input_0"]
    assert sorted(plain.tensor_names()) == sorted(hybrid.tensor_names()) == names
    for name in names:
        for step in (0, 1):
            np.testing.assert_allclose(hybrid.tensor(name).value(step), plain.tensor(name).value(step))


def test_a_closed_hook_leaves_the_blocks_to_the_next_one(tmp_path, caplog):
    """MXNet keeps a block's forward hooks: a closed hook whose graph map the next hook replaced warned
    that the next one's tensors were not saved."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4, in_units=5), mx.gluon.nn.Dense(3, in_units=4))
    net.initialize()
    net.hybridize()
    for run in ("first", "second"):
        hook = smd.Hook(
            str(tmp_path / run), save_config=smd.SaveConfig(save_interval=1), include_collections=["c"]
        )
        hook.get_collection("c").add_block_tensors(net[1], outputs=True)
        hook.register_block(net)
        net.hybridize()  # (as the README asks of a block hybridized before the hook)
        with caplog.at_level(logging.WARNING, logger="smdebug"):
            for _ in range(2):
                net(mx.nd.ones((2, 5)))
        hook.close()
        assert create_trial(str(tmp_path / run)).tensor(f"{net[1].name}_output_0").steps() == [0, 1]
    assert not [r for r in caplog.records if "did not report" in r.getMessage()]


def test_a_hybridized_layer_ending_in_an_operator_without_output_names_is_saved(tmp_path, caplog):
    """MXNet's op hook reports the output of an operator without output names (tanh, exp...) as
    "<node>_0" where the graph's Symbol says "<node>_output": the layer is saved all the same."""

    def train(out_dir, hybridize):
        mx.random.seed(0)
        with mx.name.NameManager():
            net = mx.gluon.nn.HybridSequential()
            net.add(mx.gluon.nn.Dense(8), mx.gluon.nn.HybridLambda("tanh"), mx.gluon.nn.Dense(3))
            loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
        net.initialize(mx.init.Xavier())
        if hybridize:
            net.hybridize()
        hook = _hook(
            out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=1), include_collections=["layer"]
        )
        hook.get_collection("layer").add_block_tensors(net[1], inputs=True, outputs=True)
        Run(hook, net, loss_fn).train(batches(2))
        hook.close()
        return create_trial(out_dir), net[1].name

    plain, name = train(str(tmp_path / "plain"), hybridize=False)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hybrid, _ = train(str(tmp_path / "hybrid"), hybridize=True)
    assert not [r for r in caplog.records if "did not report" in r.getMessage()]
    for tensor in (f"{name}_input_0", f"{name}_output_0"):
        assert hybrid.tensor(tensor).steps() == plain.tensor(tensor).steps() == [0, 1]
        for step in (0, 1):
            np.testing.assert_allclose(
                hybrid.tensor(tensor).value(step), plain.tensor(tensor).value(step), rtol=1e-5, atol=1e-6
            )


class _Reused(mx.gluon.HybridBlock):
    """One Dense and one activation block applied three times: twice in a chain, once beside it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = mx.gluon.nn.Dense(5, in_units=5)
            self.act = mx.gluon.nn.Activation("tanh")
            self.out = mx.gluon.nn.Dense(3)

    def hybrid_forward(self, F, x):
        chain = self.act(self.dense(self.act(self.dense(x))))
        return self.out(chain + self.act(self.dense(x * 2)))


class _Outer(mx.gluon.Block):
    """A plain block calling its (hybridizable) inner block twice in a forward pass."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inner = mx.gluon.nn.HybridSequential()
            self.inner.add(mx.gluon.nn.Dense(5, in_units=5, activation="relu"))
            self.out = mx.gluon.nn.Dense(3)

    def forward(self, x):
        return self.out(self.inner(self.inner(x)))


@pytest.mark.parametrize("model", [_Reused, _Outer])
def test_a_block_called_several_times_in_a_step_is_saved_per_call_when_hybridized(tmp_path, caplog, model):
    """Each call of a block is saved under its own number (``<block>_output_0``, ``_1``...) with its own
    value, hybridized or not: inside one cached graph the reused block's nodes share one name, and a
    hybridized block called twice reports the same nodes twice."""

    def train(out_dir, hybridize):
        mx.random.seed(0)
        with mx.name.NameManager():
            net = model()
            loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
        net.initialize(mx.init.Xavier())
        if hybridize:
            (net.inner if model is _Outer else net).hybridize()
        hook = _hook(out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=1), save_all=True)
        Run(hook, net, loss_fn).train(batches(2, seed=3))
        hook.close()
        return create_trial(out_dir), (net.inner[0] if model is _Outer else net.dense).name

    plain, reused = train(str(tmp_path / "plain"), hybridize=False)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hybrid, _ = train(str(tmp_path / "hybrid"), hybridize=True)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    names = sorted(plain.tensor_names())
    calls = 3 if model is _Reused else 2
    assert {f"{reused}_{kind}_{i}" for kind in ("input", "output") for i in range(calls)} <= set(names)
    assert sorted(hybrid.tensor_names()) == names
    for name in names:
        for step in (0, 1):
            np.testing.assert_allclose(
                hybrid.tensor(name).value(step),
                plain.tensor(name).value(step),
                rtol=1e-5,
                atol=1e-6,
                err_msg=name,
            )


def test_fused_operators_are_named_in_one_warning(tmp_path, caplog):
    """static_alloc lets MXNet fuse Dense and its activation: the fused nodes are never reported."""
    plain = _train_all(str(tmp_path / "plain"), hybridize=False)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        static = _train_all(str(tmp_path / "static"), hybridize=False, static=True)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "inside hybridized block hybridsequential0" in warnings[0], warnings
    missing = set(plain.tensor_names()) - set(static.tensor_names())
    assert missing and all(name in warnings[0] for name in missing)
    assert {"dense0_input_0", "dense1_output_0", *PARAMS, *GRADS} <= set(static.tensor_names())
    for name in static.tensor_names():
        for step in static.tensor(name).steps():
            np.testing.assert_allclose(
                static.tensor(name).value(step),
                plain.tensor(name).value(step),
                rtol=1e-5,
                atol=1e-6,
                err_msg=name,
            )


def test_hybridized_graph_built_before_registration_warns_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        trial = _train_all(str(tmp_path / "late"), hybridize=True, register_first=False)
    warnings = [r.getMessage() for r in caplog.records if "hybridized block" in r.getMessage()]
    assert len(warnings) == 1 and "hybridsequential" in warnings[0] and "register_block" in warnings[0]
    names = set(trial.tensor_names())
    assert {*PARAMS, *GRADS, LOSS, "hybridsequential0_output_0"} <= names
    assert "dense0_output_0" not in names


REDUCTIONS = ["min", "max", "mean", "std", "variance", "sum", "prod", "median", "l1", "l2"]
NUMPY = NUMPY_REDUCTIONS


def test_reductions_match_numpy():
    """On the CPU reductions run in numpy on a zero-copy view of the NDArray; on a GPU as NDArray operators
    (checked here on the CPU, where they run as well), only the scalar being copied to the host."""
    from smdebug_mxnet.plugin import smdebug_reduce, smdebug_to_numpy
    from smdebug_mxnet.tensors import reduce_on_device

    host = np.random.RandomState(3).randn(4, 6).astype(np.float32)
    value = mx.nd.array(host)
    # mx.np arrays (MXNet's NumPy-compatible API) are NDArrays too
    for reduction, absolute, array in itertools.product(
        REDUCTIONS, (False, True), (value, mx.np.array(host))
    ):
        want = NUMPY[reduction](np.abs(host) if absolute else host)
        got = smdebug_reduce(value=array, reduction=reduction, abs=absolute)
        assert isinstance(got, np.float32), reduction
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{reduction} abs={absolute} {type(array)}")
        on_device = reduce_on_device(mx.nd.abs(value) if absolute else value, reduction)
        if reduction == "median":
            assert on_device is None  # no NDArray operator: the core reduces a host copy
        else:
            assert isinstance(on_device, np.float32), reduction
            np.testing.assert_allclose(
                on_device, want, rtol=1e-5, err_msg=f"device {reduction} abs={absolute}"
            )
    np.testing.assert_array_equal(host, value.asnumpy())  # the view did not change the NDArray
    assert smdebug_reduce(value=host, reduction="max", abs=False) is None
    assert smdebug_to_numpy(value=host) is None
    np.testing.assert_array_equal(smdebug_to_numpy(value=value), host)


def test_reductions_saved_instead_of_raw_values(out_dir):
    net, loss_fn = make_net()
    config = smd.ReductionConfig(reductions=["mean", "max", "median"], abs_reductions=["min"], norms=["l2"])
    hook = _hook(
        out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=1), reduction_config=config,
        include_collections=["weights", "gradients", "losses"],
    )  # fmt: skip
    run = Run(hook, net, loss_fn)
    run.train(batches(2))
    hook.close()

    trial = create_trial(out_dir)
    tensor = trial.tensor("gradient/dense0_weight")
    for step in (0, 1):
        grad = run.seen[step]["gradient/dense0_weight"]
        np.testing.assert_allclose(tensor.reduction_value(step, "mean"), grad.mean(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(tensor.reduction_value(step, "max"), grad.max(), rtol=1e-6)
        np.testing.assert_allclose(tensor.reduction_value(step, "median"), np.median(grad), rtol=1e-6)
        np.testing.assert_allclose(
            tensor.reduction_value(step, "min", abs=True), np.abs(grad).min(), rtol=1e-6
        )
        np.testing.assert_allclose(tensor.reduction_value(step, "l2"), np.linalg.norm(grad), rtol=1e-5)
    with pytest.raises(TensorUnavailableForStep):
        tensor.value(0)  # only reductions were saved
    np.testing.assert_allclose(trial.tensor(LOSS).value(1), run.seen[1]["loss"], rtol=1e-6)  # losses stay raw


def test_save_scalar_and_save_tensor(out_dir):
    """save_scalar saves into the current step; save_tensor, as smdebug 1.0.34 for MXNet, when the next
    step starts (after the last step: that step, when the hook closes). Before training both go to the
    first step, which stays step 0."""
    net, loss_fn = make_net()
    hook = _hook(out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=1))
    run = Run(hook, net, loss_fn)
    data = batches(2)
    hook.save_tensor("before", np.ones(2, dtype=np.float32))
    hook.save_scalar("before_scalar", 3.0)
    run.train(data[:1])
    hook.save_scalar("lr", 0.1)
    hook.save_tensor("nd_stats", mx.nd.array([1.0, 2.0]), "custom")
    hook.save_tensor("np_stats", np.arange(3, dtype=np.float32))
    run.train(data[1:])
    hook.save_tensor("after", mx.nd.array([5.0]), ["custom", "default"])
    hook.close()

    trial = create_trial(out_dir)
    assert trial.steps() == [0, 1]
    assert trial.tensor(LOSS).steps() == [0, 1]
    np.testing.assert_allclose(trial.tensor("scalar/lr").value(0), 0.1)
    assert trial.tensor("before").steps() == trial.tensor("scalar/before_scalar").steps() == [0]
    np.testing.assert_array_equal(trial.tensor("nd_stats").value(1), [1.0, 2.0])
    np.testing.assert_array_equal(trial.tensor("np_stats").value(1), [0, 1, 2])
    np.testing.assert_array_equal(trial.tensor("after").value(1), [5.0])
    assert sorted(trial.tensor_names(collection="custom")) == ["after", "nd_stats"]
    assert {"before", "np_stats", "after"} <= set(trial.tensor_names(collection="default"))


def test_save_tensor_every_step_keeps_the_last_steps_value_as_smdebug_1034(out_dir):
    """A script calling save_tensor after every step: each call's value is saved at the next step, as by
    smdebug 1.0.34, the last step's included. The call after the last step has no step left (1.0.34 drops
    it): it does not displace that step's value, and the run records it as not saved."""
    net, loss_fn = make_net()
    hook = _hook(out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=1))
    run = Run(hook, net, loss_fn)
    for i, batch in enumerate(batches(3)):
        run.train([batch])
        hook.save_tensor("batch_index", np.array([float(i)]))
    hook.close()

    trial = create_trial(out_dir)
    assert trial.tensor("batch_index").steps() == [1, 2]
    for step in (1, 2):
        np.testing.assert_array_equal(trial.tensor("batch_index").value(step), [step - 1.0])
    unsaved = trial.unsaved_tensors()["worker_0"]
    assert "batch_index" in unsaved and "after the last step" in unsaved["batch_index"]["reason"]


def test_create_from_json_file(tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "hook.json"
    config.write_text(
        json.dumps(
            {
                "LocalPath": str(out),
                "HookParameters": {"save_interval": "2", "reductions": "max"},
                "CollectionConfigurations": [
                    {"CollectionName": "weights", "CollectionParameters": {"save_interval": "1"}},
                    {"CollectionName": "losses"},
                ],
            }
        )
    )
    hook = smd.Hook.create_from_json_file(str(config))
    assert isinstance(hook, smd.Hook)
    net, loss_fn = make_net()
    hook.register_block(net)
    hook.register_block(loss_fn)
    run = Run(hook, net, loss_fn)
    run.train(batches(3))
    hook.close()

    trial = create_trial(str(out))
    assert trial.steps() == [0, 1, 2]
    assert trial.tensor("dense0_weight").steps() == [0, 1, 2]
    assert trial.tensor(LOSS).steps() == [0, 2]
    np.testing.assert_allclose(
        trial.tensor("dense0_weight").reduction_value(1, "max"), run.seen[1]["dense0_weight"].max(), rtol=1e-6
    )


def test_bad_registrations_warn_and_training_goes_on(out_dir, caplog):
    net, loss_fn = make_net()
    hook = _hook(out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=1))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.register_block("not a block")
        hook.register_block(net)
    messages = [r.getMessage() for r in caplog.records]
    assert any("register_block expects a mxnet.gluon.Block, got str" in m for m in messages)
    assert any("hybridsequential0 is registered with this hook already" in m for m in messages)
    Run(hook, net, loss_fn).train(batches(2))
    hook.close()
    assert create_trial(out_dir).steps() == [0, 1]  # registered once: one step per forward


def test_running_statistics_are_the_steps_own_when_the_next_step_begins_after_its_forward(out_dir):
    """With parameters and losses only, a step begins once its model's forward pass is queued (the
    previous step is saved while MXNet computes it): parameters, batch norm's running statistics (no
    gradient) among them, are still saved as of their own step."""
    from mxnet import autograd, gluon

    mx.random.seed(0)
    with mx.name.NameManager():
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(6), gluon.nn.BatchNorm(), gluon.nn.Dense(3))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    net.initialize(mx.init.Xavier())
    hook = _hook(
        out_dir,
        net,
        loss_fn,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "losses"],
        include_regex=[".*running_mean"],
    )
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    seen = []
    for x, y in batches(3):
        with autograd.record():
            loss = loss_fn(net(x), y)
            assert hook.delayed is None or hook.step == len(seen)  # begun once the model's forward ended
        loss.backward()
        trainer.step(4)
        seen.append({p.name: p.data().asnumpy().copy() for p in net.collect_params().values()})
    hook.close()

    trial = create_trial(out_dir)
    assert trial.steps() == [0, 1, 2]
    for step in range(3):
        for name in ("batchnorm0_running_mean", "dense0_weight"):
            np.testing.assert_array_equal(trial.tensor(name).value(step), seen[step][name])
        assert trial.tensor(LOSS).value(step).shape == (4,)


def test_a_forward_pass_that_fails_still_counts_as_a_step(out_dir):
    """A model's forward pass that raises (a wrong input shape) begins its step all the same, as when the
    step begins at the forward's start: the next one is numbered after it."""
    net, loss_fn = make_net()
    hook = _hook(
        out_dir, net, loss_fn, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"]
    )
    run = Run(hook, net, loss_fn)
    data = batches(3)
    run.train(data[:2])
    with pytest.raises(mx.base.MXNetError):
        net(mx.nd.ones((4, 7)))  # dense0 was built for 5 features
    run.train(data[2:])
    hook.close()

    trial = create_trial(out_dir)
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.tensor(LOSS).steps() == [0, 1, 3]
    np.testing.assert_array_equal(trial.tensor("dense0_weight").value(3), run.seen[2]["dense0_weight"])


@pytest.mark.parametrize("hybridize", [False, True])
def test_a_collection_of_the_models_own_tensors_gives_no_hybridized_warning(tmp_path, caplog, hybridize):
    """Only the model's own input and output asked for (add_block_tensors on the model): no layer is
    lost, so no warning about layers inside a hybridized block, hybridized or not."""
    net, loss_fn = make_net(hybridize=hybridize)
    out_dir = str(tmp_path / "own")
    hook = smd.Hook(
        out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["io", "losses"]
    )
    hook.get_collection("io").add_block_tensors(net, inputs=True, outputs=True)
    hook.register_block(net)
    hook.register_block(loss_fn)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        Run(hook, net, loss_fn).train(batches(2))
        hook.close()
    assert not [r for r in caplog.records if "hybridized block" in r.getMessage()]
    names = set(create_trial(out_dir).tensor_names())
    assert {"hybridsequential0_input_0", "hybridsequential0_output_0", LOSS} <= names
