"""Hook specifications, entry-point discovery, isolation of broken plugins, alias imports.

The fixture distributions smdebug-dummy and smdebug-broken (tests/core/fixture_plugins) are pip
installed into this session's venv by nox, so discovery runs through real entry points.
"""

import contextlib
import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import smdebug
from smdebug import hookspecs, plugins
from smdebug.hook import BaseHook
from smdebug.modes import ModeKeys
from smdebug.plugin import hookimpl
from smdebug.reductions import numpy_reduction
from smdebug.trials import create_trial

HOOK_NAMES = sorted(n for n in dir(hookspecs) if n.startswith("smdebug_"))


def test_every_hookspec_has_a_test():
    tests = {n for n in globals() if n.startswith("test_hook_")}
    missing = [n for n in HOOK_NAMES if f"test_hook_{n}" not in tests]
    assert not missing, f"hook specifications without a test_hook_<name> test: {missing}"


def test_hookspecs_have_one_line_docstrings():
    for name in HOOK_NAMES:
        doc = getattr(hookspecs, name).__doc__
        assert doc and "\n" not in doc.strip(), name


def test_defaults_registered_through_the_same_hooks():
    pm = plugins.get_plugin_manager()
    assert pm.has_plugin("smdebug.defaults")
    impls = {impl.plugin_name for impl in pm.hook.smdebug_open_store.get_hookimpls()}
    assert {"smdebug.defaults", "dummy"} <= impls


def test_plugins_load_lazily():
    code = "import smdebug, smdebug.plugins as p, sys; print(p._pm is None, 'smdebug_dummy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]


def test_broken_plugin_logs_one_warning_and_others_load(caplog):
    plugins.get_plugin_manager()
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "broken" in r.getMessage()]
    assert len(warnings) == 1
    assert "smdebug-broken" in warnings[0].getMessage()
    assert "dummy" in plugins.frameworks()


def test_disable_plugins_env(monkeypatch):
    monkeypatch.setenv("SMDEBUG_DISABLE_PLUGINS", "dummy, broken")
    plugins.reset()
    pm = plugins.get_plugin_manager()
    assert not pm.has_plugin("dummy") and not pm.has_plugin("broken")
    assert "dummy" not in plugins.frameworks()


def test_disable_plugins_by_distribution_name(monkeypatch):
    monkeypatch.setenv("SMDEBUG_DISABLE_PLUGINS", "smdebug-dummy")
    plugins.reset()
    assert not plugins.get_plugin_manager().has_plugin("dummy")


# -- one test per hook specification ----------------------------------------------------------------
def test_hook_smdebug_framework():
    fw = plugins.frameworks()["dummy"]
    assert fw.package == "smdebug_dummy" and fw.import_names == ("json",)
    assert fw.version_problem() is None
    bad = plugins.Framework(alias="x", package="x", import_names=("pluggy",), supported=">=999")
    assert "outside the supported range >=999" in bad.version_problem()
    missing = plugins.Framework(alias="y", package="y", import_names=("no_such_dist_here",), supported=">=1")
    assert "not installed" in missing.version_problem()


def test_hook_smdebug_to_numpy():
    from smdebug_dummy import DummyTensor

    out = plugins.to_numpy(DummyTensor([1, 2, 3]))
    assert out.dtype == np.float32 and out.tolist() == [1, 2, 3]
    assert plugins.to_numpy(np.arange(3)).tolist() == [0, 1, 2]  # the core's default
    assert plugins.to_numpy(object()) is None


def test_hook_smdebug_reduce():
    from smdebug_dummy import DummyTensor

    t = DummyTensor([1, -5, 3])
    assert plugins.reduce(t, "max", abs=True) == 5.0 and t.reduced_here == 1
    assert plugins.reduce(t, "min", abs=False) == -5.0  # falls back to the core via to_numpy
    assert plugins.reduce(np.array([3.0, 4.0]), "l2") == pytest.approx(5.0)


class Lazy:
    """A value that lives elsewhere (a device): reading it is a transfer."""

    def __init__(self, data):
        self.data = np.asarray(data)


class BatchingPlugin:
    """Starts the reductions of Lazy values where they live and brings a step's results over at once."""

    def __init__(self, as_matrix=False):
        self.transfers: list[int] = []
        self.starts: list[int] = []  # values per smdebug_reductions call
        self.as_matrix = as_matrix  # smdebug_to_host answers with one [results, reductions] array

    @hookimpl
    def smdebug_to_numpy(self, value):
        return value.data.copy() if isinstance(value, Lazy) else None

    @hookimpl
    def smdebug_reductions(self, values, reductions):
        if not any(isinstance(v, Lazy) for v in values):
            return None
        self.starts.append(len(values))
        return [
            Lazy(np.array([numpy_reduction(v.data, r, a) for r, a in reductions], dtype=np.float32))
            if isinstance(v, Lazy) and v.data.size
            else None  # the core reduces it one by one (numpy)
            for v in values
        ]

    @hookimpl
    def smdebug_to_host(self, results):
        if not all(isinstance(r, Lazy) for r in results):
            return None
        self.transfers.append(len(results))
        return np.stack([r.data for r in results]) if self.as_matrix else [r.data for r in results]


def _batched_run(out_dir, plugin, steps=2, together=False):
    plugins.get_plugin_manager().register(plugin, name="batching")
    hook = BaseHook(
        out_dir=out_dir,
        save_config=smdebug.SaveConfig(save_interval=1),
        reduction_config=smdebug.ReductionConfig(reductions=["max", "mean"], abs_reductions=["max"]),
        include_regex=["^t"],
    )
    for step in range(steps):
        hook.begin_step()
        with hook.together() if together else contextlib.nullcontext():
            for i in range(3):
                hook.save_for_step(f"t{i}", Lazy([step, -i - 5.0, 1.0]))
            hook.save_for_step("t_empty", Lazy([]))
        hook.end_step()
    hook.close()
    return create_trial(out_dir)


def test_hook_smdebug_reductions(tmp_path):
    trial = _batched_run(str(tmp_path / "run"), BatchingPlugin())
    value = trial.tensor("t2").reduction_value(1, "max", abs=True)
    assert value == 7.0 and value.dtype == np.float32  # the plugin's dtype is stored
    assert trial.tensor("t0").reduction_value(1, "mean") == pytest.approx(-1.0)


def test_hook_smdebug_to_host(tmp_path):
    plugin = BatchingPlugin()
    _batched_run(str(tmp_path / "run"), plugin, steps=3)
    assert plugin.transfers == [3, 3, 3]  # one transfer per step, for all its tensors
    assert plugin.starts == [1] * 12  # outside a together() block: one call per tensor


@pytest.mark.parametrize("writer_process", ["0", "1"])
def test_hook_smdebug_to_host_as_one_array(tmp_path, monkeypatch, writer_process):
    """A 2-D array of the results is written as well as a list of them, by either writer (the process
    one takes over after a few steps)."""
    monkeypatch.setenv("SMDEBUG_WRITER_PROCESS", writer_process)
    steps = 7
    trial = _batched_run(str(tmp_path / "run"), BatchingPlugin(as_matrix=True), steps=steps, together=True)
    for step in range(steps):
        assert trial.tensor("t2").reduction_value(step, "max", abs=True) == 7.0
        assert trial.tensor("t0").reduction_value(step, "mean") == pytest.approx((step - 4) / 3)
        assert trial.tensor("t1").reduction_value(step, "max") == max(step, 1.0)


class InPlace:
    """A value in host memory that training changes in place."""

    def __init__(self, data):
        self.data = data


class ViewingPlugin:
    @hookimpl
    def smdebug_host_view(self, value):
        return value.data if isinstance(value, InPlace) else None  # the very memory

    @hookimpl
    def smdebug_to_numpy(self, value):
        return value.data.copy() if isinstance(value, InPlace) else None


@pytest.mark.parametrize(
    "writer_process, observed, views",
    [("1", False, 8), ("0", False, 0), ("1", True, 0)],
    ids=["process-writer", "thread-writer", "observed"],
)
def test_hook_smdebug_host_view(tmp_path, monkeypatch, writer_process, observed, views):
    """The writer process copies a view before the hook returns; the thread writer, and a plugin that
    observes saved tensors (smdebug-dummy's smdebug_tensor_saved), get a copy made by to_numpy."""
    monkeypatch.setenv("SMDEBUG_WRITER_PROCESS", writer_process)
    if not observed:
        monkeypatch.setenv("SMDEBUG_DISABLE_PLUGINS", "dummy")
        plugins.reset()
    plugins.get_plugin_manager().register(ViewingPlugin(), name="viewing")
    called = []
    monkeypatch.setattr(
        plugins, "host_view", lambda value, real=plugins.host_view: called.append(1) or real(value)
    )
    hook = BaseHook(out_dir=str(tmp_path / "run"), save_config=smdebug.SaveConfig(save_interval=1))
    weights = InPlace(np.zeros((2, 3), np.float32))
    hook.get_collection("weights").include("^w$")
    hook.include_collections.append("weights")
    for step in range(8):
        hook.begin_step()
        weights.data[:] = step
        hook.save_for_step("w", weights)
        weights.data[:] = -1  # training goes on
        hook.end_step()
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert [trial.tensor("w").value(step).tolist() for step in range(8)] == [[[s] * 3] * 2 for s in range(8)]
    assert len(called) == views


def test_reductions_saved_together_start_in_one_call(tmp_path, caplog):
    plugin = BatchingPlugin()
    trial = _batched_run(str(tmp_path / "run"), plugin, steps=3, together=True)
    assert plugin.starts == [4, 4, 4] and plugin.transfers == [3, 3, 3]
    assert trial.tensor("t1").reduction_value(2, "max", abs=True) == 6.0
    assert trial.tensor("t0").reduction_value(2, "mean") == pytest.approx(-2 / 3)
    # the value the plugin declined went to numpy, which has no reductions of an empty tensor
    assert "no reductions of t_empty: cannot compute max of an empty tensor" in caplog.text


def test_hook_smdebug_open_store():
    store = plugins.open_store("dummy://bucket/run")
    store.write_bytes("a/b.bin", b"xyz")
    assert plugins.open_store("memory://dummy-store/bucket/run").read_bytes("a/b.bin") == b"xyz"
    assert type(plugins.open_store("memory://other")).__name__ == "Store"


def test_hook_smdebug_activate(dummy_calls):
    import json

    fw = plugins.frameworks()["dummy"]
    assert plugins.activate(fw, json) == "activated"
    assert ("activate", "json") in dummy_calls


def _short_run(out_dir, steps=2):
    from smdebug_dummy import DummyTensor, Hook

    hook = Hook(
        out_dir=out_dir, save_config=smdebug.SaveConfig(save_interval=1), include_collections=["weights"]
    )
    hook.get_collection("weights").include("w")
    for _ in range(steps):
        hook.begin_step()
        hook.save_for_step("w", DummyTensor([1, 2]))
        hook.end_step()
    hook.close()
    return hook


def test_hook_smdebug_step_begin(tmp_path, dummy_calls):
    _short_run(str(tmp_path / "run"))
    assert [c for c in dummy_calls if c[0] == "step_begin"] == [
        ("step_begin", "GLOBAL", 0, 0),
        ("step_begin", "GLOBAL", 1, 1),
    ]


def test_hook_smdebug_step_end(tmp_path, dummy_calls):
    _short_run(str(tmp_path / "run"))
    assert [c for c in dummy_calls if c[0] == "step_end"] == [
        ("step_end", "GLOBAL", 0, 0),
        ("step_end", "GLOBAL", 1, 1),
    ]


def test_hook_smdebug_tensor_saved(tmp_path, dummy_calls):
    _short_run(str(tmp_path / "run"))
    assert [c for c in dummy_calls if c[0] == "tensor_saved"] == [
        ("tensor_saved", "w", 0),
        ("tensor_saved", "w", 1),
    ]


def test_hook_smdebug_hook_closed(tmp_path, dummy_calls):
    hook = _short_run(str(tmp_path / "run"))
    assert dummy_calls[-1] == ("closed", hook.out_dir)
    assert create_trial(hook.out_dir).tensor("w").value(1).tolist() == [1, 2]


def test_hook_smdebug_rules():
    rules = plugins.rules()
    assert "always_fires" in rules
    from smdebug.rules.rule import Rule

    assert issubclass(rules["always_fires"], Rule)


def test_hook_smdebug_add_commands():
    # the console script, in a real subprocess: a plugin's subcommand runs, a bad one is one clear line
    smdebug_cli = Path(sys.executable).with_name("smdebug")
    done = subprocess.run([str(smdebug_cli), "dummy-hello", "world"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "hello world\n")
    done = subprocess.run([sys.executable, "-m", "smdebug", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "dummy-hello" in done.stdout
    done = subprocess.run([str(smdebug_cli), "no-such-command"], capture_output=True, text=True)
    assert done.returncode == 2 and "invalid choice: 'no-such-command'" in done.stderr


# -- alias imports ----------------------------------------------------------------------------------
def test_alias_import_resolves_to_plugin_package():
    import smdebug_dummy

    import smdebug.dummy as smd

    assert smd is smdebug_dummy
    from smdebug.dummy.hook import Hook

    assert Hook is smdebug_dummy.Hook
    assert importlib.import_module("smdebug.dummy.hook") is sys.modules["smdebug_dummy.hook"]
    assert smdebug.dummy is smdebug_dummy
    assert smdebug_dummy.__spec__.name == "smdebug_dummy"


@pytest.mark.parametrize("alias,dist", [("pytorch", "smdebug-torch"), ("xgboost", "smdebug-xgb")])
def test_alias_without_plugin_names_the_distribution(alias, dist):
    code = f"import smdebug.{alias}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ModuleNotFoundError" in proc.stderr and f"pip install ./plugins/{dist}" in proc.stderr


def test_unknown_alias_error():
    with pytest.raises(ImportError, match="no installed smdebug plugin declares the alias 'nosuch'"):
        importlib.import_module("smdebug.nosuch")


def test_core_modules_are_not_aliased():
    assert importlib.import_module("smdebug.trials").__name__ == "smdebug.trials"
    assert smdebug.modes.TRAIN is ModeKeys.TRAIN


def test_core_installs_and_imports_without_frameworks():
    code = "import smdebug, sys; bad = {'torch','tensorflow','mxnet','xgboost'} & set(sys.modules); print(sorted(bad))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_fixture_plugins_are_real_distributions():
    from importlib import metadata

    eps = {ep.name: ep.value for ep in metadata.entry_points(group="smdebug")}
    assert eps.get("dummy") == "smdebug_dummy.plugin"
    assert Path(metadata.distribution("smdebug-dummy").locate_file("")).exists()


def test_complex_values_are_reduced_on_their_magnitude():
    z = np.array([3 + 4j, 1j, -2 + 0j])  # magnitudes 5, 1, 2
    assert plugins.reduce(z, "max") == 5.0 and plugins.reduce(z, "min") == 1.0
    assert plugins.reduce(z, "mean") == pytest.approx(8 / 3) and plugins.reduce(z, "median") == 2.0
    assert plugins.reduce(z, "sum", abs=True) == plugins.reduce(z, "sum") == pytest.approx(8.0)


def test_tensors_in_finds_a_nested_outputs_tensors_without_numbering_them(tmp_path):
    from smdebug_dummy import DummyTensor, Hook

    class TypedHook(Hook):
        tensor_types = (DummyTensor,)  # what a framework's hook declares: anything else is skipped

    hook = TypedHook(out_dir=str(tmp_path / "run"))
    a, b, c = DummyTensor([1]), DummyTensor([2]), DummyTensor([3])
    hook.begin_step()
    assert list(hook.tensors_in((a, {"x": [b, None, "text"], "y": c}))) == [a, b, c]
    assert list(hook.tensors_in(a)) == [a] and list(hook.tensors_in("text")) == []
    assert [n for n, _ in hook.numbered_tensors("out_", (a, b))] == ["out_0", "out_1"]  # numbers untouched
    hook.close()


def test_layer_wanted_asks_the_included_collections_with_a_layers_first_tensor_names(tmp_path):
    hook = BaseHook(out_dir=str(tmp_path / "run"), include_collections=["acts"])
    hook.get_collection("acts").include("^relu1_output_")
    hook.get_collection("inputs").include("^fc_input_")  # not included: does not count
    hook.begin_step()
    assert hook.layer_wanted("relu1") and not hook.layer_wanted("fc") and not hook.layer_wanted("relu2")
    version = hook.collections_version
    hook.get_collection("acts").include("^fc_input_0$")
    assert hook.collections_version != version and hook.layer_wanted("fc")
    hook.close()
