"""The PyTorch examples of the reference (saving-tensors-api.md, pytorch.md), run as a user writes them."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support import NUMPY_REDUCTIONS
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

import smdebug.pytorch as smd
from smdebug.exceptions import TensorUnavailable, TensorUnavailableForStep


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def loader(n=40, batch_size=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return DataLoader(
        TensorDataset(torch.randn(n, 12, generator=g), torch.randint(0, 4, (n,), generator=g)), batch_size
    )


def fit(hook, steps, net=None, criterion=None, mode=None, seed=0):
    """The reference's training loop; returns the model."""
    net = net or Model()
    criterion = criterion or nn.CrossEntropyLoss()
    optimizer = optim.Adam(net.parameters(), lr=0.01)
    if mode is not None:
        hook.set_mode(mode)
    done = 0
    while done < steps:
        for inputs, labels in loader(seed=seed):
            if done == steps:
                break
            optimizer.zero_grad()
            outputs = net(inputs)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()
            done += 1
    return net


def registered(hook):
    net, criterion = Model(), nn.CrossEntropyLoss()
    hook.register_module(net)
    hook.register_loss(criterion)
    return net, criterion


# -- Hook from Python constructor ------------------------------------------------------------------
def test_hook_from_python_constructor_with_every_argument(out_dir):
    hook = smd.Hook(
        out_dir,
        export_tensorboard=False,
        tensorboard_dir=None,
        dry_run=False,
        reduction_config=None,
        save_config=None,
        include_regex=None,
        include_collections=None,
        save_all=False,
        include_workers="one",
    )
    net, criterion = registered(hook)
    fit(hook, 3, net, criterion)
    hook.close()
    trial = smd.create_trial(out_dir=out_dir)
    # PyTorch saves the losses whatever the configuration; SaveConfig() saves steps 0, 500, ...
    assert trial.tensor_names() == ["CrossEntropyLoss_output_0"]
    assert trial.steps() == [0]


def test_module_loss_example(out_dir):
    hook = smd.Hook(out_dir=out_dir)
    net = Model()
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(net.parameters(), lr=0.01)
    hook.register_module(net)
    hook.register_loss(criterion)
    losses = []
    for inputs, labels in loader():
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = criterion(outputs, labels)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
    hook.close()
    trial = smd.create_trial(out_dir=out_dir)
    assert trial.tensor_names(collection="losses") == ["CrossEntropyLoss_output_0"]
    assert trial.tensor("CrossEntropyLoss_output_0").value(0) == pytest.approx(losses[0])


def test_functional_loss_example(out_dir):
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=2))
    net = Model()
    optimizer = optim.Adam(net.parameters(), lr=0.01)
    hook.register_module(net)
    losses = []
    for inputs, labels in loader():
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = F.cross_entropy(outputs, labels)
        hook.record_tensor_value(tensor_name="loss", tensor_value=loss)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names(collection="losses") == ["loss_output_0"]
    assert trial.steps() == [0, 2, 4, 6, 8]
    assert trial.tensor("loss_output_0").value(4) == pytest.approx(losses[4])


def test_record_tensor_value_of_the_loss_alone(out_dir):
    """smdebug 1.0's PyTorch page, step 3: "If using a loss which is a subclass of nn.functional, call
    hook.record_tensor_value(loss) after each training step": the loss alone is saved under the name its
    full example gives it, "loss"."""
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=2))
    net = Model()
    optimizer = optim.Adam(net.parameters(), lr=0.01)
    hook.register_module(net)
    losses = []
    for inputs, labels in loader():
        optimizer.zero_grad()
        loss = F.cross_entropy(net(inputs), labels)
        hook.record_tensor_value(loss)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names(collection="losses") == ["loss_output_0"]
    assert trial.tensor("loss_output_0").value(2) == pytest.approx(losses[2])


def test_get_hook_and_hook_submodule():
    import smdebug.pytorch.hook

    assert smdebug.pytorch.hook.Hook is smd.Hook
    assert smd.modes.TRAIN is smdebug.modes.TRAIN
    assert smd.SaveConfig is smdebug.SaveConfig and smd.ReductionConfig is smdebug.ReductionConfig


def test_get_hook_returns_the_hook(out_dir):
    hook = smd.Hook(out_dir=out_dir)
    assert smd.get_hook() is hook
    hook.close()


# -- SaveConfig ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "save_config, steps, expected",
    [
        (smd.SaveConfig(), 3, [0]),
        (smd.SaveConfig(save_interval=1), 4, [0, 1, 2, 3]),
        (smd.SaveConfig(save_interval=100, end_step=200), 260, [0, 100]),
        (smd.SaveConfig(save_interval=100, end_step=201), 260, [0, 100, 200]),
        (smd.SaveConfig(save_interval=100, start_step=150), 320, [200, 300]),
        (smd.SaveConfig(save_steps=[3, 7]), 10, [0, 3, 7]),
    ],
    ids=["default", "every", "end200", "end201", "start150", "save_steps"],
)
def test_save_config_examples(out_dir, save_config, steps, expected):
    hook = smd.Hook(out_dir=out_dir, save_config=save_config, include_collections=["weights", "gradients"])
    net, criterion = registered(hook)
    fit(hook, steps, net, criterion)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps() == expected
    assert trial.tensor("gradient/Model_fc1.weight").steps() == expected


def test_save_config_per_mode_example(out_dir):
    save_config = smd.SaveConfig(
        mode_save_configs={
            smd.modes.TRAIN: smd.SaveConfigMode(save_interval=1),
            smd.modes.EVAL: smd.SaveConfigMode(save_interval=2),
            smd.modes.PREDICT: smd.SaveConfigMode(save_interval=3),
            smd.modes.GLOBAL: smd.SaveConfigMode(save_interval=4),
        }
    )
    hook = smd.Hook(out_dir=out_dir, save_config=save_config, include_collections=["weights"])
    net, criterion = registered(hook)
    fit(hook, 5, net, criterion, mode=smd.modes.TRAIN)
    for mode in (smd.modes.EVAL, smd.modes.PREDICT):
        hook.set_mode(mode)
        with torch.no_grad():
            for _ in range(7):
                net(torch.randn(2, 12))
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2, 3, 4]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 2, 4, 6]
    assert trial.steps(mode=smd.modes.PREDICT) == [0, 3, 6]
    assert trial.steps() == [0, 1, 2, 3, 4, 5, 7, 9, 11, 12, 15, 18]
    assert trial.tensor("Model_fc1.weight").steps(mode=smd.modes.EVAL) == [0, 2, 4, 6]


def test_mode_not_specified_uses_the_default_configuration(out_dir):
    save_config = smd.SaveConfig(mode_save_configs={smd.modes.TRAIN: smd.SaveConfigMode(save_interval=2)})
    hook = smd.Hook(out_dir=out_dir, save_config=save_config, include_collections=["weights"])
    net, criterion = registered(hook)
    fit(hook, 5, net, criterion, mode=smd.modes.TRAIN)
    hook.set_mode(smd.modes.EVAL)
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(2, 12))
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 2, 4]
    assert trial.steps(mode=smd.modes.EVAL) == [0]  # the default: steps 0, 500, ...


def test_collection_save_config_overrides_the_hook_one(out_dir):
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients"],
    )
    hook.get_collection("weights").save_config = smd.SaveConfig(save_interval=3)
    net, criterion = registered(hook)
    fit(hook, 7, net, criterion)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor("Model_fc1.weight").steps() == [0, 3, 6]
    assert trial.tensor("gradient/Model_fc1.weight").steps() == list(range(7))
    assert trial.tensor("CrossEntropyLoss_output_0").steps() == list(range(7))


# -- ReductionConfig -------------------------------------------------------------------------------
NUMPY = NUMPY_REDUCTIONS


def weights_seen(hook, steps):
    """Train, recording fc1.weight as each step's forward pass used it."""
    net, criterion = registered(hook)
    seen = []
    net.register_forward_pre_hook(lambda m, i: seen.append(m.fc1.weight.detach().double().numpy().copy()))
    fit(hook, steps, net, criterion)
    hook.close()
    return seen


@pytest.mark.usefixtures("reduction_path")
@pytest.mark.parametrize(
    "config, expected",
    [
        (
            dict(reductions=["min", "max", "mean"], norms=["l1"]),
            [("min", False), ("max", False), ("mean", False), ("l1", False)],
        ),
        (
            dict(reductions=["std", "variance"], abs_reductions=["mean"], norms=["l1"]),
            [("std", False), ("variance", False), ("mean", True), ("l1", False)],
        ),
    ],
)
def test_reduction_config_examples(out_dir, config, expected):
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights"],
        reduction_config=smd.ReductionConfig(**config),
    )
    seen = weights_seen(hook, 3)
    tensor = smd.create_trial(out_dir).tensor("Model_fc1.weight")
    for step, weight in enumerate(seen):
        with pytest.raises((TensorUnavailableForStep, TensorUnavailable)):
            tensor.value(step)
        for name, absolute in expected:
            want = NUMPY[name](np.abs(weight) if absolute else weight)
            assert tensor.reduction_value(step, name, abs=absolute) == pytest.approx(want, rel=1e-5)


@pytest.mark.usefixtures("reduction_path")
def test_reduction_config_with_raw_tensor(out_dir):
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights"],
        reduction_config=smd.ReductionConfig(abs_norms=["l2"], save_raw_tensor=True),
    )
    seen = weights_seen(hook, 2)
    tensor = smd.create_trial(out_dir).tensor("Model_fc1.weight")
    np.testing.assert_allclose(tensor.value(1), seen[1], rtol=1e-7)
    assert tensor.reduction_value(1, "l2", abs=True) == pytest.approx(np.linalg.norm(seen[1]))


@pytest.mark.usefixtures("reduction_path")
def test_collection_reduction_config_overrides_the_hook_one(out_dir):
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients"],
    )
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(norms=["l2"])
    net, criterion = registered(hook)
    fit(hook, 2, net, criterion)
    grad = net.fc1.weight.grad.detach().double().numpy()
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor("Model_fc1.weight").value(1).shape == (16, 12)
    assert trial.tensor("gradient/Model_fc1.weight").reduction_value(1, "l2") == pytest.approx(
        np.linalg.norm(grad)
    )


@pytest.mark.usefixtures("reduction_path")
def test_collections_with_reduction_lists_of_different_lengths_due_at_one_step(out_dir):
    # weights reduced to one value each, biases to three, both due at the same steps: the native
    # kernel's two batches of rows (one per list) were joined as one host array, which failed, and
    # the step's reductions of both collections were recorded as unsaved
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases"],
        reduction_config=smd.ReductionConfig(reductions=["min", "max"], abs_reductions=["mean"]),
    )
    hook.get_collection("weights").reduction_config = smd.ReductionConfig(norms=["l2"])
    seen = []
    net, criterion = registered(hook)
    net.register_forward_pre_hook(
        lambda m, i: seen.append((m.fc1.weight.detach().numpy().copy(), m.fc1.bias.detach().numpy().copy()))
    )
    fit(hook, 3, net, criterion)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.unsaved_tensors() == {}
    weight, bias = trial.tensor("Model_fc1.weight"), trial.tensor("Model_fc1.bias")
    for step, (w, b) in enumerate(seen):
        assert weight.reduction_value(step, "l2") == pytest.approx(np.linalg.norm(w), rel=1e-5)
        assert bias.reduction_value(step, "min") == pytest.approx(b.min(), rel=1e-6)
        assert bias.reduction_value(step, "max") == pytest.approx(b.max(), rel=1e-6)
        assert bias.reduction_value(step, "mean", abs=True) == pytest.approx(np.abs(b).mean(), rel=1e-5)


# -- include_regex, include_collections, save_all, default collections -----------------------------
def test_include_regex(out_dir):
    hook = smd.Hook(out_dir=out_dir, include_regex=["fc1"], save_config=smd.SaveConfig(save_interval=1))
    net, criterion = registered(hook)
    fit(hook, 2, net, criterion)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names(collection="default") == [
        "Model_fc1.bias",
        "Model_fc1.weight",
        "fc1_input_0",
        "fc1_output_0",
        "gradient/Model_fc1.bias",
        "gradient/Model_fc1.weight",
    ]
    assert trial.tensor_names() == sorted(
        trial.tensor_names(collection="default") + ["CrossEntropyLoss_output_0"]
    )


def test_include_collections(out_dir):
    hook = smd.Hook(
        out_dir=out_dir,
        include_collections=["weights", "biases"],
        save_config=smd.SaveConfig(save_interval=1),
    )
    net, criterion = registered(hook)
    fit(hook, 2, net, criterion)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names() == [
        "CrossEntropyLoss_output_0",
        "Model_fc1.bias",
        "Model_fc1.weight",
        "Model_fc2.bias",
        "Model_fc2.weight",
    ]
    assert trial.tensor_names(collection="biases") == ["Model_fc1.bias", "Model_fc2.bias"]


def test_save_all(out_dir):
    hook = smd.Hook(out_dir=out_dir, save_all=True, save_config=smd.SaveConfig(save_interval=1))
    net, criterion = registered(hook)
    fit(hook, 2, net, criterion)
    hook.close()
    trial = smd.create_trial(out_dir)
    names = set(trial.tensor_names())
    params = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    modules = ["Model", "fc1", "relu", "fc2"]
    assert names == (
        {f"Model_{p}" for p in params}
        | {f"gradient/Model_{p}" for p in params}
        | {f"{m}_{io}_0" for m in modules for io in ("input", "output")}
        | {"CrossEntropyLoss_input_0", "CrossEntropyLoss_input_1", "CrossEntropyLoss_output_0"}
    )
    assert trial.tensor_names(collection="all") == sorted(names)


def test_losses_can_be_switched_off_with_end_step_zero(out_dir):
    hook = smd.Hook(
        out_dir=out_dir, include_collections=["weights"], save_config=smd.SaveConfig(save_interval=1)
    )
    hook.get_collection("losses").save_config.end_step = 0  # as the reference writes it
    net, criterion = registered(hook)
    fit(hook, 2, net, criterion)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert "CrossEntropyLoss_output_0" not in trial.tensor_names()
    assert trial.tensor("Model_fc1.weight").steps() == [0, 1]


def test_dry_run_writes_nothing(tmp_path):
    out = tmp_path / "run"
    hook = smd.Hook(
        out_dir=str(out), dry_run=True, save_all=True, save_config=smd.SaveConfig(save_interval=1)
    )
    net, criterion = registered(hook)
    fit(hook, 2, net, criterion)
    hook.close()
    assert not out.exists()


# -- Common Hook API -------------------------------------------------------------------------------
def test_save_scalar_and_save_tensor(out_dir):
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    net, criterion = registered(hook)
    fit(hook, 1, net, criterion)
    hook.save_scalar("accuracy", 0.75, sm_metric=True)
    hook.save_scalar("lr", torch.tensor(0.01))
    hook.save_tensor("numpy_tensor", np.arange(6).reshape(2, 3), "custom")
    hook.save_tensor(
        tensor_name="torch_tensor", tensor_value=torch.ones(2, 2) * 3, collections_to_write=["custom", "more"]
    )
    hook.save_tensor("default_coll", torch.zeros(3))
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor("scalar/accuracy").value(0).item() == pytest.approx(0.75)
    assert trial.tensor("scalar/lr").value(0).item() == pytest.approx(0.01)
    np.testing.assert_array_equal(trial.tensor("numpy_tensor").value(0), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(trial.tensor("torch_tensor").value(0), np.full((2, 2), 3.0))
    assert trial.tensor_names(collection="custom") == ["numpy_tensor", "torch_tensor"]
    assert trial.tensor_names(collection="more") == ["torch_tensor"]
    assert trial.tensor_names(collection="default") == ["default_coll"]


def test_collections_api(out_dir):
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    assert {"all", "default", "weights", "biases", "gradients", "losses"} <= set(hook.get_collections())
    coll = hook.get_collection("my_coll")  # created on demand
    assert isinstance(coll, smd.Collection) and coll.name == "my_coll"
    coll.include("fc2.*weight")
    coll.save_histogram = False
    coll.reduction_config = smd.ReductionConfig(save_raw_tensor=True)
    coll.save_config = smd.SaveConfig(save_interval=2)
    assert coll.include_regex == ["fc2.*weight"]
    hook.add_collection(smd.Collection("relus", include_regex=["relu_output"]))
    hook.include_collections.extend(["my_coll", "relus"])
    net, criterion = registered(hook)
    fit(hook, 3, net, criterion)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names(collection="my_coll") == ["Model_fc2.weight", "gradient/Model_fc2.weight"]
    assert trial.tensor("Model_fc2.weight").steps() == [0, 2]
    assert trial.tensor_names(collection="relus") == ["relu_output_0"]
    assert trial.tensor("relu_output_0").steps() == [0, 1, 2]


def test_add_module_tensors(out_dir):
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["relu", "fc"]
    )
    net, criterion = registered(hook)
    hook.get_collection("relu").add_module_tensors(net.relu, inputs=True, outputs=False)
    hook.get_collection("fc").add_module_tensors(net.fc2)
    relu_inputs, fc2_outputs = [], []
    net.relu.register_forward_hook(lambda m, i, o: relu_inputs.append(i[0].detach().clone()))
    net.fc2.register_forward_hook(lambda m, i, o: fc2_outputs.append(o.detach().clone()))
    fit(hook, 2, net, criterion)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names(collection="relu") == ["relu_input_0"]
    assert trial.tensor_names(collection="fc") == ["fc2_output_0"]
    for step in (0, 1):
        np.testing.assert_array_equal(trial.tensor("relu_input_0").value(step), relu_inputs[step].numpy())
        np.testing.assert_array_equal(trial.tensor("fc2_output_0").value(step), fc2_outputs[step].numpy())


def test_set_mode_train_eval(out_dir):
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    net, criterion = registered(hook)
    hook.set_mode(smd.modes.TRAIN)
    fit(hook, 3, net, criterion)
    hook.set_mode(smd.modes.EVAL)
    net.eval()
    with torch.no_grad():
        for inputs, labels in loader(n=8):
            criterion(net(inputs), labels)
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 1]
    assert trial.mode(4) == smd.modes.EVAL and trial.mode_step(4) == 1


# -- create_from_json_file -------------------------------------------------------------------------
def write_config(path, out_dir):
    config = {
        "S3Path": "s3://bucket/prefix",
        "LocalPath": out_dir,
        "HookParameters": {"save_all": "false", "save_interval": "2", "include_regex": "fc2_output"},
        "CollectionConfigurations": [
            {"CollectionName": "weights"},
            {"CollectionName": "gradients", "CollectionParameters": {"save_interval": "3"}},
            {
                "CollectionName": "relu_activations",
                "CollectionParameters": {"include_regex": "relu*", "save_interval": "1"},
            },
        ],
    }
    path.write_text(json.dumps(config))
    return str(path)


def check_json_run(out_dir):
    trial = smd.create_trial(out_dir)
    assert trial.tensor("Model_fc1.weight").steps() == [0, 2, 4]
    assert trial.tensor("gradient/Model_fc1.weight").steps() == [0, 3]
    assert trial.tensor("relu_output_0").steps() == [0, 1, 2, 3, 4]
    assert trial.tensor("fc2_output_0").steps() == [0, 2, 4]
    assert trial.tensor("CrossEntropyLoss_output_0").steps() == [0, 2, 4]


def test_create_from_json_file_through_the_environment(tmp_path, monkeypatch, out_dir):
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", write_config(tmp_path / "config.json", out_dir))
    hook = smd.Hook.create_from_json_file()
    assert isinstance(hook, smd.Hook) and hook.out_dir == out_dir
    net, criterion = registered(hook)
    fit(hook, 5, net, criterion)
    hook.close()
    check_json_run(out_dir)


def test_create_from_json_file_with_a_path(tmp_path, out_dir):
    hook = smd.Hook.create_from_json_file(write_config(tmp_path / "config.json", out_dir))
    net, criterion = registered(hook)
    fit(hook, 5, net, criterion)
    hook.close()
    check_json_run(out_dir)


def test_get_hook_creates_from_json(tmp_path, monkeypatch, out_dir):
    import smdebug.hook

    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", write_config(tmp_path / "config.json", out_dir))
    monkeypatch.setattr(smdebug.hook, "_active_hook", None)
    assert smd.get_hook() is None
    hook = smd.get_hook(create_if_not_exists=True)
    assert isinstance(hook, smd.Hook) and smd.get_hook() is hook
    hook.close()
