"""The plugin's hooks (framework, capture, reduction) and the hook's robustness."""

import copy
import io
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import smdebug.pytorch as smd
from smdebug import plugins
from smdebug.exceptions import SMDebugTypeError
from smdebug.plugin import hookimpl
from smdebug.reductions import numpy_reduction

REDUCTIONS = ["min", "max", "median", "mean", "std", "variance", "sum", "prod", "l1", "l2"]


def test_plugin_declares_the_pytorch_framework():
    fw = plugins.frameworks()["pytorch"]
    assert (fw.alias, fw.package, fw.import_names, fw.distribution) == (
        "pytorch",
        "smdebug_torch",
        ("torch",),
        "torch",
    )
    assert fw.supported == ">=2.0" and fw.version_problem() is None


def test_entry_point_module_does_not_import_torch():
    code = (
        "import sys; from smdebug import plugins; plugins.frameworks(); import smdebug_torch.plugin;"
        "import numpy as np; assert plugins.to_numpy(np.ones(2)).tolist() == [1, 1];"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_alias_import_is_the_plugin_package():
    import smdebug.pytorch
    import smdebug.pytorch.hook
    import smdebug_torch
    import smdebug_torch.hook

    assert smdebug.pytorch is smdebug_torch and smdebug.pytorch.hook is smdebug_torch.hook
    for name in ["Hook", "SaveConfig", "SaveConfigMode", "ReductionConfig", "Collection", "CollectionKeys"]:
        assert hasattr(smd, name), name
    assert smd.CollectionKeys.WEIGHTS == "weights" and callable(smd.create_trial) and callable(smd.get_hook)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(3, 4),
        torch.randn(5, dtype=torch.float64),
        torch.randn(2, 3).half(),
        torch.arange(12, dtype=torch.int32).reshape(3, 4),
        torch.tensor([True, False]),
        torch.tensor(2.5),
    ],
    ids=["float32", "float64", "float16", "int32", "bool", "scalar"],
)
def test_to_numpy_keeps_dtype_and_values(tensor):
    array = plugins.to_numpy(tensor)
    assert array.dtype == tensor.numpy().dtype and array.shape == tuple(tensor.shape)
    np.testing.assert_array_equal(array, tensor.numpy())


def test_to_numpy_special_tensors():
    bf16 = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    array = plugins.to_numpy(bf16)
    assert array.dtype == np.float32 and array.tolist() == [1.5, -2.25, 3.0]
    param = nn.Parameter(torch.ones(2, 2))
    assert plugins.to_numpy(param * 2).tolist() == [[2, 2], [2, 2]]  # requires grad: detached
    sparse = torch.eye(3).to_sparse()
    np.testing.assert_array_equal(plugins.to_numpy(sparse), np.eye(3))
    strided = torch.arange(20.0).reshape(4, 5)[:, ::2].t()
    np.testing.assert_array_equal(plugins.to_numpy(strided), strided.numpy())


def test_to_numpy_copies_so_later_in_place_updates_do_not_leak():
    t = torch.zeros(3)
    array = plugins.to_numpy(t)
    t.add_(1)
    assert array.tolist() == [0, 0, 0]


def test_hooks_decline_values_that_are_not_torch_tensors():
    from smdebug_torch import plugin

    assert plugin.smdebug_to_numpy(value=np.ones(2)) is None
    assert plugin.smdebug_reduce(value=[1.0, 2.0], reduction="max", abs=False) is None


@pytest.mark.usefixtures("reduction_path")
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("absolute", [False, True], ids=["plain", "abs"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool]
)
def test_reductions_computed_by_torch_equal_numpy(reduction, absolute, dtype):
    g = torch.Generator().manual_seed(1)
    values = torch.randn(4, 6, generator=g) * 3  # an even count: the median averages two middle values
    if reduction == "prod":
        values = values.clamp(-1.5, 1.5)
    tensor = values.to(dtype) if dtype != torch.bool else values > 0
    from smdebug_torch.tensors import reduce

    got = reduce(tensor, reduction, absolute)
    assert isinstance(got, (float, np.floating)) and np.ndim(got) == 0
    host = tensor.float().numpy() if dtype == torch.bfloat16 else tensor.numpy()
    expected = numpy_reduction(host, reduction, absolute)
    assert got == pytest.approx(expected, rel=2e-5 if dtype != torch.float64 else 1e-12, abs=1e-6)


@pytest.mark.usefixtures("reduction_path")
def test_reduction_through_the_plugin_manager_and_edge_cases():
    assert plugins.reduce(torch.tensor([1.0, -5.0, 3.0]), "max", abs=True) == 5.0
    assert plugins.reduce(torch.tensor([[1, 2], [3, 4]], dtype=torch.int8), "mean") == 2.5
    assert np.isnan(plugins.reduce(torch.tensor([1.0, float("nan"), 0.0, 2.0]), "median"))
    assert plugins.reduce(torch.tensor([1 + 1j, -2 + 0j]), "l1") == pytest.approx(np.sqrt(2) + 2)
    # complex values have no order: every reduction is of their magnitude, in torch as in numpy
    z = torch.tensor([1 + 1j, -2 + 0j, 3j])
    assert plugins.reduce(z, "min") == pytest.approx(np.sqrt(2)) == numpy_reduction(z.numpy(), "min")
    assert plugins.reduce(z, "mean") == pytest.approx((np.sqrt(2) + 5) / 3)
    big = torch.full((70000,), 60000.0, dtype=torch.float16)  # would overflow a float16 sum
    assert plugins.reduce(big, "sum") == pytest.approx(60000.0 * 70000)
    with pytest.raises(ValueError):
        plugins.reduce(torch.zeros(0), "mean")


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)


def test_register_module_rejects_what_is_not_a_module(out_dir):
    hook = smd.Hook(out_dir=out_dir)
    with pytest.raises(SMDebugTypeError):
        hook.register_module(lambda x: x)
    with pytest.raises(SMDebugTypeError):
        hook.register_loss(torch.nn.functional.mse_loss)
    hook.close()


def test_registering_twice_warns_and_does_not_double_count(out_dir, caplog):
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"]
    )
    model = Small()
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.register_module(model)
    assert "already registered" in caplog.text
    model(torch.ones(1, 3))
    model(torch.ones(1, 3))
    hook.close()
    assert smd.create_trial(out_dir).steps() == [0, 1]


@pytest.mark.parametrize("submodule_first", [False, True])
def test_registering_a_submodule_of_a_registered_model_does_not_double_the_steps(
    out_dir, caplog, submodule_first
):
    """A model and one of its submodules both registered (either order): one step per forward call of
    the model, its tensors named within the model (the submodule's forward inside it started a second
    step, and its parameters were saved twice, under a second name)."""
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "fc"],
    )
    hook.get_collection("fc").include("^fc_output")
    model = Small()
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        for module in (model.fc, model) if submodule_first else (model, model.fc):
            hook.register_module(module)
    assert "Small" in caplog.text and "Linear" in caplog.text
    for _ in range(3):
        model(torch.ones(1, 3)).sum().backward()
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.steps() == [0, 1, 2]
    assert trial.tensor_names() == [
        "Small_fc.weight",
        "fc_output_0",
        "gradient/Small_fc.bias",
        "gradient/Small_fc.weight",
    ]
    assert trial.tensor("gradient/Small_fc.weight").steps() == [0, 1, 2]


def test_a_model_still_registered_with_an_open_hook_is_said_so_when_registered_again(tmp_path, caplog):
    """A hook made again in the same process (a notebook cell run twice) for a model the first, still open
    hook holds: one warning names the first hook's out_dir, which goes on saving; once it is closed, a new
    hook registers the model without a word."""
    model = Small()
    EVERY_STEP = smd.SaveConfig(save_interval=1)
    first = smd.Hook(out_dir=str(tmp_path / "first"), save_config=EVERY_STEP, include_collections=["weights"])
    first.register_module(model)
    model(torch.ones(1, 3))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        second = smd.Hook(
            out_dir=str(tmp_path / "second"), save_config=EVERY_STEP, include_collections=["weights"]
        )
        second.register_module(model)
    assert str(tmp_path / "first") in caplog.text and "still open" in caplog.text
    model(torch.ones(1, 3))
    first.close()
    second.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        third = smd.Hook(
            out_dir=str(tmp_path / "third"), save_config=EVERY_STEP, include_collections=["weights"]
        )
        third.register_module(model)
        model(torch.ones(1, 3))
        third.close()
    assert caplog.text == ""
    assert smd.create_trial(str(tmp_path / "first")).steps() == [0, 1]
    assert smd.create_trial(str(tmp_path / "third")).steps() == [0]


def test_copies_and_pickles_of_a_registered_model_carry_no_hook(out_dir):
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"]
    )
    model = Small()
    hook.register_module(model)
    ema = copy.deepcopy(model)  # e.g. an EMA copy: must not be a second source of steps
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    model(torch.ones(1, 3))
    ema(torch.ones(1, 3))
    loaded(torch.ones(1, 3)).sum().backward()
    hook.close()
    assert hook.step == 0
    assert smd.create_trial(out_dir).steps() == [0]


def test_a_closed_hook_does_nothing(out_dir):
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"]
    )
    model = Small()
    hook.register_module(model)
    model(torch.ones(1, 3)).sum().backward()
    hook.close()
    model(torch.ones(1, 3)).sum().backward()  # hooks were removed
    assert hook.step == 0
    assert smd.create_trial(out_dir).steps() == [0]


def test_a_tensor_without_memory_of_its_own_is_copied_not_viewed(caplog):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from smdebug import plugins

    with FakeTensorMode():
        fake = torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        assert plugins.host_view(fake) is None  # to_numpy is asked instead, and says why it cannot
        assert plugins.host_view(torch.ones(2, requires_grad=True)).tolist() == [1.0, 1.0]
    assert "failed" not in caplog.text


def test_a_failing_save_never_breaks_training(out_dir, caplog, monkeypatch):
    from smdebug_torch import tensors

    def broken(value):
        raise RuntimeError("device lost")

    monkeypatch.setattr(tensors, "to_numpy", broken)
    monkeypatch.setattr(tensors, "host_view", broken)  # a local run's writer takes a view of CPU tensors
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"]
    )
    model = Small()
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        for _ in range(2):
            opt.zero_grad()
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
    hook.close()
    assert "device lost" in caplog.text


def test_add_module_tensors_for_a_module_not_registered_warns(out_dir, caplog):
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["stray"]
    )
    model = Small()
    hook.register_module(model)
    hook.get_collection("stray").add_module_tensors(nn.ReLU())
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        model(torch.ones(1, 3))
        model(torch.ones(1, 3))
    hook.close()
    assert caplog.text.count("not part of a module registered") == 1


def test_module_with_dict_output_and_loss_without_model(out_dir):
    class DictOut(nn.Module):
        def forward(self, x):
            return {"logits": x * 2, "aux": (x + 1, [x - 1])}

    hook = smd.Hook(out_dir=out_dir, save_all=True, save_config=smd.SaveConfig(save_interval=1))
    model = DictOut()
    hook.register_module(model)
    model(torch.ones(2))
    hook.close()
    trial = smd.create_trial(out_dir)
    assert [trial.tensor(f"DictOut_output_{i}").value(0).tolist() for i in range(3)] == [
        [2, 2],
        [2, 2],
        [0, 0],
    ]

    # a loss registered alone still gives steps
    hook = smd.Hook(out_dir=out_dir + "2", save_config=smd.SaveConfig(save_interval=1))
    criterion = nn.MSELoss()
    hook.register_loss(criterion)
    for i in range(3):
        criterion(torch.full((2,), float(i)), torch.zeros(2))
    hook.close()
    loss = smd.create_trial(out_dir + "2").tensor("MSELoss_output_0")
    assert [loss.value(s).item() for s in loss.steps()] == [0.0, 1.0, 4.0]


class LossWatcher:
    def __init__(self):
        self.seen = []

    @hookimpl
    def smdebug_tensor_saved(self, name, value, step):
        self.seen.append((step, name, value.dtype, value.shape, value.item()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_loss_saved_raw_each_step_keeps_its_dtype_and_a_listener_added_later_gets_it(out_dir, dtype):
    """A one-value tensor saved raw skips the plugin call and the writer's ring (its copy rides in the
    message); whether anything listens is remembered until the plugins change: one registered after two
    steps gets the loss from the third."""
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    criterion = nn.MSELoss()
    hook.register_loss(criterion)
    watcher = LossWatcher()
    for i in range(4):
        if i == 2:
            plugins.get_plugin_manager().register(watcher, name="loss-watcher")
        criterion(torch.full((2,), i / 3, dtype=dtype, requires_grad=True), torch.zeros(2, dtype=dtype))
    hook.close()
    expected = [(torch.tensor(i / 3, dtype=dtype) ** 2).item() for i in range(4)]
    np_dtype = np.float32 if dtype == torch.float32 else np.float64
    assert watcher.seen == [(s, "MSELoss_output_0", np_dtype, (), expected[s]) for s in (2, 3)]
    loss = smd.create_trial(out_dir).tensor("MSELoss_output_0")
    values = [loss.value(s) for s in loss.steps()]
    assert [(v.dtype, v.shape) for v in values] == [(np_dtype, ())] * 4
    assert [v.item() for v in values] == expected


def test_custom_loss_module_without_loss_in_its_name_goes_to_losses(out_dir):
    class Criterion(nn.Module):
        def forward(self, a, b):
            return ((a - b) ** 2).mean()

    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    model, criterion = Small(), Criterion()
    hook.register_module(model)
    hook.register_loss(criterion)
    criterion(model(torch.ones(1, 3)), torch.zeros(1, 2)).backward()
    hook.close()
    assert smd.create_trial(out_dir).tensor_names(collection="losses") == ["Criterion_output_0"]


def test_lazy_modules_are_saved_once_initialized(out_dir, caplog):
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 1))
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients"],
    )
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        for _ in range(3):
            model(torch.ones(2, 3)).sum().backward()
    hook.close()
    assert not caplog.records
    trial = smd.create_trial(out_dir)
    assert trial.tensor("Sequential_0.weight").steps() == [1, 2]  # uninitialized when step 0 began
    # materialized by step 0's forward pass: its gradients are saved from step 0 on
    assert trial.tensor("gradient/Sequential_0.weight").steps() == [0, 1, 2]
    assert trial.tensor("gradient/Sequential_0.weight").value(0).shape == (4, 3)
    assert trial.tensor("gradient/Sequential_2.weight").steps() == [0, 1, 2]


def test_parameters_added_or_replaced_after_registration_are_saved_from_the_next_step(out_dir):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    extra = nn.Linear(4, 2)  # made before the model is registered: its own registration is long past
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients"],
    )
    hook.register_module(model)
    for step in range(4):
        if step == 1:
            model.add_module("head", extra)
        if step == 2:
            model[0].weight = nn.Parameter(torch.full((4, 3), 7.0))
        model(torch.ones(2, 3)).sum().backward()
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor("Sequential_head.weight").steps() == [1, 2, 3]
    assert trial.tensor("gradient/Sequential_head.weight").steps() == [1, 2, 3]
    assert trial.tensor("gradient/Sequential_0.weight").steps() == [0, 1, 2, 3]
    assert np.all(trial.tensor("Sequential_0.weight").value(2) == 7.0)
    assert not np.all(trial.tensor("Sequential_0.weight").value(1) == 7.0)


def test_gradients_only_saves_no_parameter_and_still_follows_new_ones(out_dir):
    model = nn.Sequential(nn.Linear(3, 4))
    hook = smd.Hook(
        out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["gradients"]
    )
    hook.register_module(model)
    for step in range(3):
        if step == 1:
            model.add_module("head", nn.Linear(4, 2))
        model(torch.ones(2, 3)).sum().backward()
    hook.close()
    trial = smd.create_trial(out_dir)
    assert trial.tensor_names(collection="weights") == []
    assert trial.tensor("gradient/Sequential_head.weight").steps() == [1, 2]
    assert trial.tensor("gradient/Sequential_0.weight").steps() == [0, 1, 2]


def test_idle_steps_run_no_module_or_gradient_callback_and_due_steps_save_everything(out_dir):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    loss_fn = nn.MSELoss()
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=3),
        include_collections=["weights", "gradients", "losses", "relu"],
    )
    hook.get_collection("relu").include("1_output")
    hook.register_module(model)
    hook.register_loss(loss_fn)
    callbacks, loss_callbacks = [], []
    for _ in range(7):
        loss = loss_fn(model(torch.ones(2, 3)), torch.zeros(2, 1))
        callbacks.append(
            any(m._forward_hooks for m in model.modules())
            or any(p._backward_hooks or p._post_accumulate_grad_hooks for p in model.parameters())
        )
        loss_callbacks.append(bool(loss_fn._forward_hooks or loss_fn._forward_pre_hooks))
        loss.backward()
    hook.close()
    assert callbacks == [True, False, False, True, False, False, True]
    assert loss_callbacks == callbacks  # the model starts the steps: the loss needs a callback only to save
    trial = smd.create_trial(out_dir)
    for name in ("1_output_0", "gradient/Sequential_0.weight", "Sequential_2.weight", "MSELoss_output_0"):
        assert trial.tensor(name).steps() == [0, 3, 6], name
    assert all(not m._forward_hooks for m in model.modules())  # closed: nothing left on the model


@pytest.mark.parametrize("loss_first", [False, True])
def test_a_loss_starts_the_steps_only_while_no_model_is_registered(out_dir, loss_first):
    model, loss_fn = nn.Linear(3, 1), nn.MSELoss()
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=2))
    hook.register_loss(loss_fn)
    assert loss_fn._forward_pre_hooks  # no model yet: the loss starts the steps
    for _ in range(3 if loss_first else 0):
        loss_fn(torch.ones(2, 1), torch.zeros(2, 1))
    hook.register_module(model)
    assert not loss_fn._forward_pre_hooks
    for _ in range(4):
        loss_fn(model(torch.ones(2, 3)), torch.zeros(2, 1)).backward()
    hook.close()
    start = 3 if loss_first else 0
    assert hook.step == start + 3
    assert smd.create_trial(out_dir).tensor("MSELoss_output_0").steps() == [
        s for s in range(start + 4) if s % 2 == 0
    ]


def test_only_modules_a_collection_may_want_carry_a_callback_and_a_new_pattern_takes_effect(out_dir):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    loss_fn = nn.MSELoss()
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["gradients", "relu"],
    )
    hook.get_collection("relu").include("^nothing_yet$")
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hooked = []
    for step in range(4):
        if step == 2:  # mid-run, every step armed: the ReLU's output is wanted from now on
            hook.get_collection("relu").include("^1_output")
        loss = loss_fn(model(torch.ones(2, 3)), torch.zeros(2, 1))
        hooked.append(([i for i, m in enumerate(model) if m._forward_hooks], bool(loss_fn._forward_hooks)))
        loss.backward()
    hook.close()
    # no module of the model is hooked until a collection asks; the losses (always included) are
    assert hooked == [([], True), ([], True), ([1], True), ([1], True)]
    trial = smd.create_trial(out_dir)
    assert trial.tensor("1_output_0").steps() == [2, 3]
    assert trial.tensor("gradient/Sequential_0.weight").steps() == [0, 1, 2, 3]
    assert trial.tensor("MSELoss_output_0").steps() == [0, 1, 2, 3]
