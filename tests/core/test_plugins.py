"""Hook specifications, entry-point discovery, isolation of broken plugins, alias imports.

The fixture distributions smdebug-dummy and smdebug-broken (tests/core/fixture_plugins) are pip
installed into this session's venv by nox, so discovery runs through real entry points.
"""

import contextlib
import importlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pluggy
import pytest

import smdebug
from smdebug import hookspecs, plugins
from smdebug.hook import BaseHook
from smdebug.modes import ModeKeys
from smdebug.plugin import hookimpl
from smdebug.reductions import numpy_reduction, reduction_tensor_name
from smdebug.trials import create_trial

HOOK_NAMES = sorted(n for n in dir(hookspecs) if n.startswith("smdebug_"))


def test_every_hookspec_has_a_test():
    tests = {n for n in globals() if n.startswith("test_hook_")}
    missing = [n for n in HOOK_NAMES if f"test_hook_{n}" not in tests]
    assert not missing, f"hook specifications without a test_hook_<name> test: {missing}"


def test_hookspecs_docstrings_carry_the_whole_contract():
    """A short first line, then every argument, what to return, and how the answers combine."""
    import inspect

    for name in HOOK_NAMES:
        spec = getattr(hookspecs, name)
        doc = inspect.getdoc(spec)
        first, _, rest = doc.partition("\n\n")
        assert "\n" not in first and len(first) <= 100 and first.endswith("."), name
        for arg in inspect.signature(spec).parameters:
            assert f"    {arg}: " in rest, f"{name}: argument {arg} undocumented"
        assert "Returns:" in rest, name
        firstresult = spec.smdebug_spec["firstresult"]
        assert ("firstresult" in rest) == firstresult, f"{name}: firstresult semantics"
        assert firstresult or "Every" in rest, f"{name}: how the answers combine"


def test_defaults_registered_through_the_same_hooks():
    pm = plugins.get_plugin_manager()
    assert pm.has_plugin("smdebug.defaults")
    impls = {impl.plugin_name for impl in pm.hook.smdebug_open_store.get_hookimpls()}
    assert {"smdebug.defaults", "dummy"} <= impls


def test_plugins_load_lazily():
    code = (
        "import smdebug, smdebug.plugins as p, sys; print(not p.host.loaded, 'smdebug_dummy' in sys.modules)"
    )
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


def test_disable_plugins_with_a_typo_names_it_and_the_nearest_plugin(monkeypatch, caplog):
    monkeypatch.setenv("SMDEBUG_DISABLE_PLUGINS", "dumy, smdebug-dummy")
    plugins.reset()
    assert not plugins.get_plugin_manager().has_plugin("dummy")  # the right name still works
    (line,) = [r.getMessage() for r in caplog.records if "SMDEBUG_DISABLE_PLUGINS names" in r.getMessage()]
    assert "'dumy', which is no installed plugin; did you mean 'dummy'?" in line
    assert "broken" in line and "smdebug-dummy" in line  # the names it takes


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
    [("1", False, 8), ("0", False, 8), ("1", True, 0)],
    ids=["process-writer", "thread-writer", "observed"],
)
def test_hook_smdebug_host_view(tmp_path, monkeypatch, writer_process, observed, views):
    """Either writer copies a view before the hook returns (the writer process into the memory it shares
    with its child); a plugin that observes saved tensors (smdebug-dummy's smdebug_tensor_saved) gets a
    copy made by to_numpy."""
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


@pytest.mark.parametrize("writer_process", ["0", "1"])
def test_tensors_saved_many_at_once_start_their_reductions_in_one_call(tmp_path, monkeypatch, writer_process):
    """save_many_for_step: one plugin call per step for the same names tuple, step after step (either
    writer: the process one takes over after a few steps); a tensor whose collection also wants it raw
    sends the list through save_for_step, and nothing is lost."""
    monkeypatch.setenv("SMDEBUG_WRITER_PROCESS", writer_process)
    plugin = BatchingPlugin(as_matrix=True)
    plugins.get_plugin_manager().register(plugin, name="batching")
    hook = BaseHook(
        out_dir=str(tmp_path / "run"),
        save_config=smdebug.SaveConfig(save_interval=1),
        reduction_config=smdebug.ReductionConfig(reductions=["max", "mean"], abs_reductions=["max"]),
        include_regex=["^t"],
    )
    names = ("t0", "t1", "t2", "t_empty")
    steps = 7
    for step in range(steps):
        if step == 5:  # from now on t1 is saved raw as well
            hook.get_collection("raw", create=True).include("^t1$")
            hook.get_collection("raw").reduction_config = smdebug.ReductionConfig(save_raw_tensor=True)
            hook.include_collections.append("raw")
            hook.collections_changed()
        hook.begin_step()
        hook.save_many_for_step(names, [Lazy([step, -i - 5.0, 1.0]) for i in range(3)] + [Lazy([])])
        hook.end_step()
    hook.close()
    assert plugin.starts == [4] * 5 + [4, 4]  # the last two steps: together, one call for the four
    trial = create_trial(str(tmp_path / "run"))
    for step in range(steps):
        assert trial.tensor("t2").reduction_value(step, "max", abs=True) == 7.0
        assert trial.tensor("t0").reduction_value(step, "mean") == pytest.approx((step - 4) / 3)
        assert trial.tensor("t1").reduction_value(step, "max") == max(step, 1.0)
    assert trial.tensor("t1").value(6).tolist() == [6.0, -6.0, 1.0]
    assert trial.tensor("t1").steps() == list(range(steps))


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


class Crashing:
    @hookimpl
    def smdebug_add_commands(self, subparsers):
        subparsers.add_parser("crash").set_defaults(func=lambda args: 1 / 0)


def test_a_command_failing_unexpectedly_exits_2_not_1(capsys):
    # exit code 1 is an answer (diff: the runs differ; rules: a rule fired): a bug must not read as one
    from smdebug.cli import main

    pm = plugins.get_plugin_manager()
    pm.register(Crashing(), name="crashing")
    try:
        assert main(["crash"]) == 2
    finally:
        pm.unregister(name="crashing")
    err = capsys.readouterr().err
    assert "Traceback" in err and "smdebug crash: internal error: ZeroDivisionError: division by zero" in err


# -- the plugin host: validation, wrappers, monitoring, tracing, `smdebug plugins` -------------------
class Misspelled:
    @hookimpl
    def smdebug_to_numpyy(self, value):
        return np.zeros(1)


def test_a_misspelled_hook_is_a_load_error_naming_the_closest_hook():
    pm = plugins.get_plugin_manager()
    with pytest.raises(pluggy.PluginValidationError) as failed:
        pm.register(Misspelled(), name="typo")
    message = str(failed.value)
    assert "'typo'" in message and "'smdebug_to_numpyy'" in message and "'smdebug_to_numpy'" in message
    assert not pm.has_plugin("typo")  # refused whole: nothing of it registered
    pm.check_pending()  # what stays registered names real hooks only
    from smdebug_dummy import DummyTensor

    assert plugins.to_numpy(DummyTensor([1, 2])).tolist() == [1, 2]  # the others keep working


class Doubling:
    """A new-style wrapper on the per-tensor capture hook: it changes every answer."""

    def __init__(self):
        self.calls = 0

    @hookimpl(wrapper=True)
    def smdebug_to_numpy(self, value):
        array = yield
        self.calls += 1
        return None if array is None else array * 2


class StoreWatcher:
    """An old-style hookwrapper on a hook called once per run."""

    def __init__(self):
        self.opened = []

    @hookimpl(hookwrapper=True)
    def smdebug_open_store(self, uri):
        outcome = yield
        self.opened.append((uri, type(outcome.get_result()).__name__))


class FailingWrapper:
    @hookimpl(wrapper=True)
    def smdebug_to_numpy(self, value):
        raise RuntimeError("the wrapper breaks before its yield")
        yield  # a generator


def _saved_run(out_dir, values):
    hook = BaseHook(out_dir=out_dir, save_config=smdebug.SaveConfig(save_interval=1), include_regex=["^w$"])
    for value in values:
        hook.begin_step()
        hook.save_for_step("w", value)
        hook.end_step()
    hook.close()
    return create_trial(out_dir)


def test_hook_wrappers_are_honoured_on_the_per_step_path_and_elsewhere(tmp_path):
    doubling, watcher = Doubling(), StoreWatcher()
    pm = plugins.get_plugin_manager()
    pm.register(doubling, name="doubling")
    pm.register(watcher, name="watcher")
    from smdebug_dummy import DummyTensor

    trial = _saved_run(str(tmp_path / "run"), [DummyTensor([1, 2]), np.array([3.0, 4.0])])
    assert trial.tensor("w").value(0).tolist() == [2, 4]  # the plugin's answer, through the wrapper
    assert trial.tensor("w").value(1).tolist() == [6, 8]  # the core's answer, through the wrapper
    assert doubling.calls >= 2
    assert (str(tmp_path / "run"), "Store") in watcher.opened
    pm.unregister(name="doubling")
    assert plugins.to_numpy(np.array([1.0])).tolist() == [1.0]  # back to the plain loop


def test_a_failing_wrapper_is_skipped_and_reported_once(tmp_path, caplog):
    plugins.get_plugin_manager().register(FailingWrapper(), name="failing-wrapper")
    trial = _saved_run(str(tmp_path / "run"), [np.array([1.0]), np.array([2.0])])
    assert [trial.tensor("w").value(s).tolist() for s in (0, 1)] == [[1.0], [2.0]]
    logged = [r.getMessage() for r in caplog.records if "'failing-wrapper'" in r.getMessage()]
    assert len(logged) == 1 and "failed in smdebug_to_numpy" in logged[0]
    assert "the wrapper breaks before its yield" in logged[0]


class Raising:
    @hookimpl(tryfirst=True)
    def smdebug_to_numpy(self, value):
        raise ValueError("cannot convert")

    @hookimpl
    def smdebug_step_end(self, hook, step):
        raise ValueError(f"fails at step {step}")


def test_hookcall_monitoring_sees_the_per_step_calls_and_isolation_holds(tmp_path, caplog):
    """add_hookcall_monitoring works: every call goes through pluggy while something monitors them,
    and a raising implementation is still skipped there and reported once."""
    pm = plugins.get_plugin_manager()
    pm.register(Raising(), name="raising")
    seen = []
    undo = pm.add_hookcall_monitoring(lambda name, impls, kwargs: seen.append(name), lambda *a: None)
    try:
        trial = _saved_run(str(tmp_path / "run"), [np.array([1.0]), np.array([2.0]), np.array([3.0])])
    finally:
        undo()
    assert trial.tensor("w").value(2).tolist() == [3.0]
    assert seen.count("smdebug_step_end") == 3 and seen.count("smdebug_step_begin") == 3
    assert seen.count("smdebug_to_numpy") >= 3 and "smdebug_open_store" in seen
    logged = [r.getMessage() for r in caplog.records if "'raising'" in r.getMessage()]
    assert len(logged) == 2, logged  # once per hook, not per call
    seen.clear()
    plugins.to_numpy(np.array([1.0]))
    assert seen == []  # undone: the plain loop again


def test_trace_switch_logs_every_hook_call(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SMDEBUG_TRACE_PLUGINS", "1")
    plugins.reset()
    level = logging.getLogger("smdebug").level
    trial = _saved_run(str(tmp_path / "run"), [np.array([1.0, 2.0])])
    assert trial.tensor("w").value(0).tolist() == [1.0, 2.0]
    traced = [r.getMessage() for r in caplog.records if "plugin trace" in r.getMessage()]
    for name in ("smdebug_open_store", "smdebug_step_begin", "smdebug_to_numpy", "smdebug_step_end"):
        assert any(f"{name} [hook]" in m for m in traced), name
    assert any("finish smdebug_to_numpy -->" in m for m in traced)  # and what each call returned
    monkeypatch.delenv("SMDEBUG_TRACE_PLUGINS")
    plugins.reset()
    assert logging.getLogger("smdebug").level == level  # tracing made its records visible, until now
    caplog.clear()
    plugins.to_numpy(np.arange(2))
    assert "plugin trace" not in caplog.text


def test_trace_switch_in_a_fresh_process(tmp_path):
    code = "import numpy as np\nfrom smdebug import plugins\nplugins.to_numpy(np.arange(3))\n"
    env = {k: v for k, v in os.environ.items() if k != "SMDEBUG_TRACE_PLUGINS"}
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert "smdebug_to_numpy" not in quiet.stderr
    env["SMDEBUG_TRACE_PLUGINS"] = "1"
    traced = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    traced_lines = [line for line in traced.stderr.splitlines() if "plugin trace:" in line]
    assert traced_lines[0].endswith(" smdebug_to_numpy [hook]"), traced.stderr
    assert "value: [0 1 2]" in traced.stderr and "finish smdebug_to_numpy --> [0 1 2]" in traced_lines[-1]


def test_smdebug_plugins_command_lists_plugins_hooks_and_load_errors():
    smdebug_cli = Path(sys.executable).with_name("smdebug")
    done = subprocess.run([str(smdebug_cli), "plugins"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    blocks = {b.split()[0]: b for b in done.stdout.split("\n") if b and not b.startswith(" ")}
    assert blocks["dummy"] == "dummy  (smdebug-dummy 0.1.0)"
    assert blocks["smdebug.defaults"].startswith("smdebug.defaults  (smdebug-core ")
    text = done.stdout
    dummy = text[text.index("dummy  (") :].split("\n")
    assert dummy[1] == "  entry point: smdebug_dummy.plugin"
    assert dummy[2].startswith("  hooks: smdebug_activate, smdebug_add_commands, smdebug_framework")
    assert "broken  (smdebug-broken 0.1.0)" in text
    assert "  LOAD ERROR: ImportError: smdebug_broken needs a framework that is not installed" in text

    done = subprocess.run([str(smdebug_cli), "plugins", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    listed = {p["name"]: p for p in json.loads(done.stdout)}
    assert listed["dummy"]["distribution"] == "smdebug-dummy" and listed["dummy"]["version"] == "0.1.0"
    assert "smdebug_to_numpy" in listed["dummy"]["hooks"] and listed["dummy"]["error"] is None
    assert listed["broken"]["error"].startswith("ImportError: ") and listed["broken"]["hooks"] == []
    assert listed["smdebug.defaults"]["distribution"] == "smdebug-core"
    assert "smdebug_open_store" in listed["smdebug.defaults"]["hooks"]


def test_smdebug_plugins_in_process_twice(capsys):
    from smdebug import cli

    for _ in range(2):  # the command's module must not shadow smdebug.plugins for the next parser
        assert cli.main(["plugins", "--json"]) == 0
        assert "dummy" in {p["name"] for p in json.loads(capsys.readouterr().out)}


def test_describe_shows_disabled_and_registered_plugins(monkeypatch):
    monkeypatch.setenv("SMDEBUG_DISABLE_PLUGINS", "dummy")
    plugins.reset()
    plugins.get_plugin_manager().register(StoreWatcher(), name="watcher")
    found = {info.name: info for info in plugins.describe()}
    assert found["dummy"].disabled and found["dummy"].hooks == ()
    assert found["watcher"].distribution is None and found["watcher"].hooks == ("smdebug_open_store",)


class ProtocolStore:
    """A third party's store: no subclass of the core's, it only has the members of smdebug.types.Store
    (here kept in a local folder by delegation, under its own URI scheme)."""

    def __init__(self, uri, root):
        from smdebug.store import Store

        self._inner = Store(root)
        self.uri, self.root, self.is_local = uri, self._inner.root, True
        self.calls = []

    def __getattr__(self, name):  # path, read_bytes, stage, ...: the members the core calls
        self.calls.append(name)
        return getattr(self._inner, name)


class ProtocolStorage:
    def __init__(self, root):
        self.root = root
        self.opened = []

    @hookimpl
    def smdebug_open_store(self, uri):
        if not uri.startswith("proto://"):
            return None
        store = ProtocolStore(uri, str(self.root / uri[len("proto://") :]))
        self.opened.append(store)
        return store


def test_a_storage_plugin_implements_the_store_protocol_without_subclassing(tmp_path):
    from smdebug import types
    from smdebug.store import Store

    assert isinstance(Store(str(tmp_path)), types.Store)  # the core's own satisfies the protocol
    storage = ProtocolStorage(tmp_path / "proto")
    plugins.get_plugin_manager().register(storage, name="proto-storage")
    store = plugins.open_store("proto://run")
    assert isinstance(store, types.Store) and not isinstance(store, Store)
    trial = _saved_run("proto://run", [np.array([1.0]), np.array([2.0])])  # written and read through it
    assert trial.steps() == [0, 1] and trial.tensor("w").value(1).tolist() == [2.0]
    assert create_trial(str(tmp_path / "proto" / "run")).tensor("w").value(0).tolist() == [1.0]
    called = {name for store in storage.opened for name in store.calls}
    assert {"stage", "write_bytes", "create_exclusive"} <= called, called  # the writer's calls
    assert {"read_many", "list"} & called, called  # the reader's


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


class Garbage:
    """Answers every capture and reduction hook first, with the wrong kind of value."""

    @hookimpl(tryfirst=True)
    def smdebug_to_numpy(self, value):
        return "not an array"

    @hookimpl(tryfirst=True)
    def smdebug_reduce(self, value, reduction, abs):
        return "not a number"

    @hookimpl(tryfirst=True)
    def smdebug_reductions(self, values, reductions):
        return [1]  # one result, whatever the number of values

    @hookimpl(tryfirst=True)
    def smdebug_to_host(self, results):
        return ["x"]


def test_a_plugin_returning_garbage_is_skipped_and_reported_once(tmp_path, caplog):
    """A wrong answer is no answer: the next implementation answers, every raw value and reduction is
    saved (a string from smdebug_reduce lost the reduction, a short list from smdebug_reductions lost
    the step's reductions), and one line per hook names the plugin."""
    plugins.get_plugin_manager().register(Garbage(), name="garbage")
    out = str(tmp_path / "run")
    hook = BaseHook(
        out_dir=out,
        save_config=smdebug.SaveConfig(save_interval=1),
        reduction_config=smdebug.ReductionConfig(
            reductions=["max", "mean"], abs_reductions=["max"], save_raw_tensor=True
        ),
        include_regex=["^w", "^v"],
    )
    values = [np.array([1.0, -4.0]), np.array([2.0, -3.0, 7.0])]
    for step in range(2):
        hook.begin_step()
        with hook.together():
            hook.save_for_step("w", values[0] * (step + 1))
            hook.save_for_step("v", values[1] * (step + 1))
        hook.end_step()
    hook.close()
    trial = create_trial(out)
    for step in range(2):
        for name, value in zip(("w", "v"), values):
            value = value * (step + 1)
            assert trial.tensor(name).value(step).tolist() == value.tolist()
            assert trial.tensor(name).reduction_value(step, "max") == value.max()
            assert trial.tensor(name).reduction_value(step, "mean") == pytest.approx(value.mean())
            assert trial.tensor(name).reduction_value(step, "max", abs=True) == np.abs(value).max()
    logged = [r.getMessage() for r in caplog.records if "'garbage'" in r.getMessage()]
    assert len(logged) == len(set(logged)) and logged, logged
    assert any("smdebug_to_numpy" in m and "returned str, not a numpy array" in m for m in logged), logged


class GarbageRules:
    @hookimpl
    def smdebug_rules(self):
        return ["not", "a", "dict"]


class NotARuleClass:
    @hookimpl
    def smdebug_rules(self):
        return {"forty_two": 42}


def test_rules_of_the_wrong_kind_are_skipped_and_reported_once(caplog):
    """A plugin whose smdebug_rules returns no dict made every rule lookup raise AttributeError (the CLI's
    `smdebug rules` included); one that maps a name to no class was dropped without a word."""
    from smdebug.rules.builtin import builtin_rules

    pm = plugins.get_plugin_manager()
    pm.register(GarbageRules(), name="garbage-rules")
    pm.register(NotARuleClass(), name="not-a-class")
    for _ in range(2):
        rules = builtin_rules()
    assert "always_fires" in rules and "vanishing_gradient" in rules and "forty_two" not in rules
    logged = [r.getMessage() for r in caplog.records if "smdebug_rules" in r.getMessage()]
    assert len(logged) == 2, logged
    assert any("'garbage-rules'" in m and "returned list" in m for m in logged), logged
    assert any("'not-a-class'" in m and "returned dict" in m for m in logged), logged


class DictFramework:
    @hookimpl
    def smdebug_framework(self):
        return {"alias": "dictfw", "import_names": ["dictfw"]}


def test_a_framework_declaration_of_the_wrong_kind_is_reported_once(caplog):
    """A plugin declaring its framework as a dict (not Framework) was ignored without a word: its
    activation and alias never worked and nothing said why."""
    plugins.get_plugin_manager().register(DictFramework(), name="dict-framework")
    for _ in range(2):
        assert "dictfw" not in plugins.frameworks() and "dummy" in plugins.frameworks()
    logged = [r.getMessage() for r in caplog.records if "'dict-framework'" in r.getMessage()]
    assert logged == [
        "smdebug: plugin 'dict-framework' failed in smdebug_framework and is skipped: TypeError: returned dict, "
        "not a smdebug.plugin.Framework"
    ], logged


class NotAStore:
    @hookimpl(tryfirst=True)
    def smdebug_open_store(self, uri):
        return object()  # none of the Store protocol's members


def test_a_store_of_the_wrong_kind_is_skipped_and_reported_once(tmp_path, caplog):
    """A storage plugin whose smdebug_open_store returns no Store made every hook creation (and the CLI,
    and every Trial) fail with AttributeError; the next implementation now answers."""
    plugins.get_plugin_manager().register(NotAStore(), name="not-a-store")
    trial = _saved_run(str(tmp_path / "run"), [np.array([1.0]), np.array([2.0])])
    assert trial.steps() == [0, 1] and trial.tensor("w").value(1).tolist() == [2.0]
    logged = [r.getMessage() for r in caplog.records if "'not-a-store'" in r.getMessage()]
    assert logged == [
        "smdebug: plugin 'not-a-store' failed in smdebug_open_store and is skipped: TypeError: returned "
        "object, not a store (the members of smdebug.types.Store; it lacks uri, root, is_local, fs, ...)"
    ], logged


class WrongArguments:
    @hookimpl
    def smdebug_step_end(self, hook, stepp):
        pass


def test_an_implementation_with_wrong_arguments_is_one_line_naming_the_hooks_arguments():
    """pluggy's own refusal was three lines that named neither the hook's arguments nor the closest one."""
    pm = plugins.get_plugin_manager()
    with pytest.raises(pluggy.PluginValidationError) as failed:
        pm.register(WrongArguments(), name="wrong-args")
    assert str(failed.value) == (
        "plugin 'wrong-args' implements smdebug_step_end(hook, stepp), but the hook's arguments are "
        "(hook, mode, step, mode_step): 'stepp' is none of them; did you mean 'step'?"
    )
    assert not pm.has_plugin("wrong-args")


class Hanging:
    """An exporter whose observation calls never return in time (a server that does not answer)."""

    def __init__(self, hook_name):
        import threading

        self.hook_name, self.calls, self.release = hook_name, 0, threading.Event()

    def _hang(self):
        self.calls += 1
        self.release.wait(20)

    @hookimpl
    def smdebug_step_end(self, step):
        if self.hook_name == "smdebug_step_end":
            self._hang()

    @hookimpl
    def smdebug_hook_closed(self, hook):
        if self.hook_name == "smdebug_hook_closed":
            self._hang()


@pytest.mark.parametrize("hook_name", ["smdebug_step_end", "smdebug_hook_closed"])
def test_a_plugin_that_hangs_in_an_observation_hook_does_not_stall_training(
    tmp_path, monkeypatch, caplog, hook_name
):
    """A plugin's step-end (or close) observer that hung stalled the training thread for as long as it
    hung (forever, for a server that never answers). It is now waited for SMDEBUG_PLUGIN_TIMEOUT seconds,
    once: named in one line and skipped from then on; every step is saved and the run finished."""
    monkeypatch.setenv("SMDEBUG_PLUGIN_TIMEOUT", "0.5")
    hanging = Hanging(hook_name)
    plugins.get_plugin_manager().register(hanging, name="hanging")
    try:
        trial = _saved_run(str(tmp_path / "run"), [np.array([float(v)]) for v in range(4)])
    finally:
        hanging.release.set()
    assert hanging.calls == 1  # not called again once it hung
    assert trial.steps() == [0, 1, 2, 3] and trial.tensor("w").value(3).tolist() == [3.0]
    assert (tmp_path / "run" / "training_job_end.ts").exists()  # closed: the run is finished
    logged = [r.getMessage() for r in caplog.records if "'hanging'" in r.getMessage()]
    assert logged == [
        f"smdebug: plugin 'hanging' failed in {hook_name} and is skipped: PluginHung: it did not return "
        "within 0.5 s (SMDEBUG_PLUGIN_TIMEOUT) and is not called again"
    ], logged


class Slow:
    def __init__(self):
        self.steps = []

    @hookimpl
    def smdebug_step_begin(self, step):
        import time

        if not self.steps:
            time.sleep(1.2)
        self.steps.append(step)


def test_a_slow_observer_is_named_once_and_still_sees_every_step(tmp_path, caplog):
    slow = Slow()
    plugins.get_plugin_manager().register(slow, name="slow")
    trial = _saved_run(str(tmp_path / "run"), [np.array([1.0]), np.array([2.0]), np.array([3.0])])
    assert slow.steps == [0, 1, 2] and trial.steps() == [0, 1, 2]
    logged = [r.getMessage() for r in caplog.records if "'slow'" in r.getMessage()]
    assert len(logged) == 1 and "took 1." in logged[0] and "in smdebug_step_begin" in logged[0], logged


def test_the_plugin_api_the_docs_name_is_public_and_in_help_basehook(tmp_path):
    """docs/writing-a-plugin.md sends plugin authors to help(BaseHook) for its API (BaseHook had no
    docstring: the list was only the module's) and names every call and override point in its tables."""
    import re

    doc = (Path(__file__).parents[2] / "docs" / "writing-a-plugin.md").read_text()
    section = doc[doc.index("## BaseHook's plugin API") : doc.index("**Health**")]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    names = {name for row in rows for name in re.findall(r"`(?:with self\.)?([a-z_]+)", row)}
    hook = BaseHook(out_dir=str(tmp_path / "run"))
    try:
        missing = sorted(name for name in names if not hasattr(hook, name) or name.startswith("_"))
        assert missing == [], missing
        undocumented = sorted(name for name in names if name not in (BaseHook.__doc__ or ""))
        assert undocumented == [], undocumented
    finally:
        hook.close()


class HangingOnce:
    """A plugin whose calls made once (its declaration, a run's store) never return in time."""

    def __init__(self):
        import threading

        self.release = threading.Event()

    @hookimpl
    def smdebug_framework(self):
        self.release.wait(20)

    @hookimpl(tryfirst=True)
    def smdebug_open_store(self, uri):
        self.release.wait(20)


def test_a_plugin_that_hangs_in_a_call_made_once_does_not_stall_the_process(tmp_path, monkeypatch, caplog):
    """A plugin whose smdebug_framework hung stalled every configured Python process at its start (and
    every `import smdebug.<alias>`); one whose smdebug_open_store hung, every hook and Trial."""
    monkeypatch.setenv("SMDEBUG_PLUGIN_TIMEOUT", "0.5")
    hanging = HangingOnce()
    plugins.get_plugin_manager().register(hanging, name="hanging-once")
    try:
        assert "dummy" in plugins.frameworks()
        trial = _saved_run(str(tmp_path / "run"), [np.array([1.0]), np.array([2.0])])
    finally:
        hanging.release.set()
    assert trial.steps() == [0, 1] and trial.tensor("w").value(1).tolist() == [2.0]
    logged = [r.getMessage() for r in caplog.records if "'hanging-once'" in r.getMessage()]
    assert logged == [
        "smdebug: plugin 'hanging-once' failed in smdebug_framework and is skipped: PluginHung: it did not "
        "return within 0.5 s (SMDEBUG_PLUGIN_TIMEOUT) and is not called again"
    ], logged


# -- a storage plugin written from the Store protocol alone --------------------------------------------
class StagedBytes:
    def __init__(self, store, relpath):
        self.store, self.relpath, self.parts, self.size = store, relpath, [], 0

    def write(self, data):
        self.parts.append(bytes(data))
        self.size += len(data)

    def commit(self):
        self.store.write_bytes(self.relpath, b"".join(self.parts))

    def resume(self):
        pass

    def discard(self):
        self.parts, self.size = [], 0

    @property
    def in_memory(self):
        return self.size

    def spill(self):
        pass


class KVStore:
    """Only the members of smdebug.types.Store (no delegation to the core's Store): fsspec's memory
    filesystem under kv://."""

    def __init__(self, uri, is_local):
        import fsspec

        self.uri, self.is_local = uri, is_local
        self.root = "/kv/" + uri[len("kv://") :].strip("/")
        self.fs = fsspec.filesystem("memory")

    def path(self, relpath):
        return f"{self.root}/{relpath}" if relpath else self.root

    def relative(self, path):
        return path[len(self.root) + 1 :]

    def describe(self, exc):
        return f"{type(exc).__name__}: {exc}"

    def write_bytes(self, relpath, data):
        self.fs.pipe_file(self.path(relpath), bytes(data))

    def create_exclusive(self, relpath, data):
        if self.fs.exists(self.path(relpath)):
            raise FileExistsError(relpath)
        self.write_bytes(relpath, data)

    def remove(self, relpath):
        try:
            self.fs.rm_file(self.path(relpath))
        except FileNotFoundError:
            pass

    def stage(self, relpath):
        return StagedBytes(self, relpath)

    def open_write(self, relpath):
        return self.fs.open(self.path(relpath), "wb")

    def read_bytes(self, relpath, start=None, end=None):
        return self.fs.cat_file(self.path(relpath))[start:end]

    def read_many(self, relpaths):
        found = {}
        for relpath in relpaths:
            try:
                found[relpath] = self.read_bytes(relpath)
            except FileNotFoundError:
                pass
        return found

    def read_ranges(self, relpath_ranges):
        out = []
        for relpath, start, end in relpath_ranges:
            try:
                out.append(self.read_bytes(relpath, start, end))
            except Exception as exc:
                out.append(exc)
        return out

    def exists(self, relpath):
        return self.fs.exists(self.path(relpath))

    def list(self, relprefix):
        base = self.path(relprefix)
        return sorted(self.relative(p) for p in self.fs.find(base)) if self.fs.exists(base) else []

    def list_dirs(self, relprefix):
        try:
            entries = self.fs.ls(self.path(relprefix), detail=True)
        except FileNotFoundError:
            return []
        return sorted(self.relative(e["name"]) for e in entries if e["type"] == "directory")


class KVStorage:
    def __init__(self, is_local):
        self.is_local = is_local

    @hookimpl
    def smdebug_open_store(self, uri):
        return KVStore(uri, self.is_local) if uri.startswith("kv://") else None


@pytest.mark.parametrize("is_local", [False, True])
def test_a_store_with_only_the_protocols_members_writes_and_reads_runs(is_local, capsys):
    """A store written from smdebug.types.Store alone (no delegation to the core's Store) lost every step
    (the writer called its staged file's seal, no member of StagedFile) and no Trial or CLI command could
    open its runs (they called its probe, no member of Store; a local one's open_regular neither)."""
    from smdebug import types
    from smdebug.cli import main

    plugins.get_plugin_manager().register(KVStorage(is_local), name="kv-storage")
    uri = f"kv://runs/{'local' if is_local else 'remote'}"
    assert isinstance(plugins.open_store(uri), types.Store)
    trial = _saved_run(uri, [np.array([1.0, 2.0]), np.array([3.0, 4.0])])
    assert trial.steps() == [0, 1] and trial.tensor("w").value(1).tolist() == [3.0, 4.0]
    capsys.readouterr()
    assert main(["ls", uri]) == 0
    out = capsys.readouterr().out
    assert "training ended" in out and "Steps: 0, 1" in out, out


class Watching:
    def __init__(self):
        self.names = []

    @hookimpl
    def smdebug_tensor_saved(self, name, step):
        self.names.append((step, name))


def test_an_observer_sees_reductions_by_the_stored_names_its_hookspec_gives():
    """smdebug_tensor_saved's docstring gave a reduction's name as '<tensor>_<reduction>'; an observer
    gets the stored name, smdebug/reductions/<reduction>/<tensor> (abs_<reduction>)."""
    watching = Watching()
    plugins.get_plugin_manager().register(watching, name="watching")
    hook = BaseHook(
        out_dir="memory://observed-reductions",
        save_config=smdebug.SaveConfig(save_interval=1),
        reduction_config=smdebug.ReductionConfig(reductions=["max"], abs_reductions=["mean"]),
        include_regex=["^w$"],
    )
    hook.begin_step()
    hook.save_for_step("w", np.array([1.0, -3.0]))
    hook.end_step()
    hook.close()
    assert sorted(watching.names) == [(0, "smdebug/reductions/abs_mean/w"), (0, "smdebug/reductions/max/w")]
    doc = hookspecs.smdebug_tensor_saved.__doc__
    assert "smdebug/reductions/<reduction>/<tensor>" in doc and "abs_<reduction>" in doc


class AsksItself:
    """An observer whose step-end call reaches another of its own hooks (it lists the rules)."""

    def __init__(self):
        self.rules_seen = []

    @hookimpl
    def smdebug_rules(self):
        return {}

    @hookimpl
    def smdebug_step_end(self, step):
        self.rules_seen.append("vanishing_gradient" in plugins.rules())


def test_a_plugin_reaching_its_own_hooks_from_its_thread_does_not_wait_on_itself(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("SMDEBUG_PLUGIN_TIMEOUT", "2")
    asks = AsksItself()
    plugins.get_plugin_manager().register(asks, name="asks-itself")
    _saved_run(str(tmp_path / "run"), [np.array([1.0]), np.array([2.0])])
    assert asks.rules_seen == [True, True]
    assert not [r for r in caplog.records if "'asks-itself'" in r.getMessage()]


# -- a plugin's per-tensor capture hooks misbehaving (they run in place, on the training thread) --------
class Opaque:
    """A framework value only its own plugin converts (no __array__)."""

    def __init__(self, data):
        self.data = data


class FailingCapture:
    """The plugin that converts Opaque values, failing at it."""

    @hookimpl
    def smdebug_to_numpy(self, value):
        if isinstance(value, Opaque):
            raise RuntimeError("the device is gone")


def test_a_tensor_a_failing_plugin_could_not_capture_is_recorded_naming_the_plugin(tmp_path, caplog):
    """The run recorded the core fallback's error for the tensor ("cannot convert a Opaque"), not the
    plugin's: the user could not tell which plugin lost it, nor why."""
    plugins.get_plugin_manager().register(FailingCapture(), name="failing-capture")
    out = str(tmp_path / "run")
    hook = BaseHook(
        out_dir=out, save_config=smdebug.SaveConfig(save_interval=1), include_regex=["^w$", "^o$"]
    )
    for step in range(2):
        hook.begin_step()
        hook.save_for_step("w", np.array([float(step)]))
        hook.save_for_step("o", Opaque([float(step)]))
        hook.end_step()
    hook.close()
    trial = create_trial(out)
    assert [trial.tensor("w").value(s).tolist() for s in (0, 1)] == [[0.0], [1.0]]  # training went on
    unsaved = trial.unsaved_tensors()
    assert list(unsaved) == ["worker_0"] and list(unsaved["worker_0"]) == ["o"], unsaved
    reason = unsaved["worker_0"]["o"]["reason"]
    assert "plugin 'failing-capture' failed in smdebug_to_numpy (RuntimeError: the device is gone)" in reason
    listed = subprocess.run([sys.executable, "-m", "smdebug", "ls", out], capture_output=True, text=True)
    assert listed.returncode == 0 and "failing-capture" in listed.stdout, listed.stdout + listed.stderr
    logged = [r.getMessage() for r in caplog.records if "'failing-capture'" in r.getMessage()]
    assert len(logged) == 2, logged  # the plugin's failure and the tensor it lost, each once
    assert "is skipped" in logged[0] and "could not save o at step 0" in logged[1], logged


class HangingCapture:
    """A plugin whose conversion hangs at its first call (a device that stopped answering) until released,
    and leaves every value to the next implementation."""

    def __init__(self, seconds=60.0):
        import threading

        self.calls, self.seconds, self.release = 0, seconds, threading.Event()

    @hookimpl(tryfirst=True)
    def smdebug_to_numpy(self, value):
        self.calls += 1
        if self.calls == 1:
            self.release.wait(self.seconds)


def test_a_capture_hook_that_hangs_is_named_while_it_hangs_and_dropped_once_it_returns(
    tmp_path, monkeypatch, caplog
):
    """A per-tensor capture call runs on the training thread, so a hang there cannot be interrupted: it
    went unsaid and the plugin was called again at every tensor. Over 6 x SMDEBUG_PLUGIN_TIMEOUT one line
    names the plugin while training still waits; once the call returns the plugin is not called there
    again, the core answers, and every step is saved."""
    import threading

    monkeypatch.setenv("SMDEBUG_PLUGIN_TIMEOUT", "0.2")  # a budget of 1.2 s for a call in place
    hanging = HangingCapture()
    plugins.get_plugin_manager().register(hanging, name="hanging-capture")
    said_while_hung = []

    def release_once_named():
        for _ in range(600):
            if any("'hanging-capture'" in r.getMessage() for r in caplog.records):
                said_while_hung.append(True)
                break
            hanging.release.wait(0.05)
        hanging.release.set()

    releaser = threading.Thread(target=release_once_named, daemon=True)
    releaser.start()
    trial = _saved_run(str(tmp_path / "run"), [np.array([float(v)]) for v in range(4)])
    releaser.join()
    assert said_while_hung == [True]
    assert hanging.calls == 1  # not called again once it returned
    assert trial.steps() == [0, 1, 2, 3] and [trial.tensor("w").value(s)[0] for s in range(4)] == [0, 1, 2, 3]
    logged = [r.getMessage() for r in caplog.records if "'hanging-capture'" in r.getMessage()]
    assert len(logged) == 1, logged
    assert "failed in smdebug_to_numpy" in logged[0] and "has not returned for 1.2 s" in logged[0], logged
    assert "training waits for it" in logged[0] and "SMDEBUG_DISABLE_PLUGINS=hanging-capture" in logged[0]


def test_a_capture_hook_over_its_budget_is_dropped_with_one_line(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SMDEBUG_PLUGIN_TIMEOUT", "0.2")
    slow = HangingCapture(seconds=1.5)  # its first call takes 1.5 s, over the 1.2 s budget
    plugins.get_plugin_manager().register(slow, name="slow-capture")
    trial = _saved_run(str(tmp_path / "run"), [np.array([float(v)]) for v in range(3)])
    assert slow.calls == 1 and [trial.tensor("w").value(s)[0] for s in range(3)] == [0, 1, 2]
    logged = [r.getMessage() for r in caplog.records if "'slow-capture'" in r.getMessage()]
    assert len(logged) == 1 and "smdebug_to_numpy" in logged[0] and "not called there again" in logged[0]


class LostDevice:
    """Starts reductions on its device, then cannot bring them over (the device is gone)."""

    class Handle:  # a result on the device: no plugin converts it
        pass

    @hookimpl(tryfirst=True)
    def smdebug_reductions(self, values, reductions):
        return [self.Handle() for _ in values]

    @hookimpl(tryfirst=True)
    def smdebug_to_host(self, results):
        raise RuntimeError("device lost")


def test_reductions_that_never_reach_the_host_are_recorded_unsaved(tmp_path):
    """A step's reductions lost on their way to the host were one warning and nothing in the run; each is
    recorded as unsaved, and the raw values of the same steps are still saved."""
    plugins.get_plugin_manager().register(LostDevice(), name="lost-device")
    out = str(tmp_path / "run")
    hook = BaseHook(
        out_dir=out,
        save_config=smdebug.SaveConfig(save_interval=1),
        reduction_config=smdebug.ReductionConfig(reductions=["max"], save_raw_tensor=True),
        include_regex=["^w"],
    )
    for step in range(2):
        hook.begin_step()
        with hook.together():
            hook.save_for_step("w", np.array([1.0, -4.0]) * (step + 1))
        hook.end_step()
    hook.close()
    trial = create_trial(out)
    assert trial.tensor("w").value(1).tolist() == [2.0, -8.0]
    (unsaved,) = trial.unsaved_tensors().values()
    assert set(unsaved) == {reduction_tensor_name("w", "max", False)}
    assert "device lost" in unsaved[reduction_tensor_name("w", "max", False)]["reason"]


class SlowFramework(HangingCapture):
    """A framework's plugin whose first conversion waits long for its device (a long step's queued work)."""

    @hookimpl
    def smdebug_framework(self):
        return None  # declares no framework here; implementing the hook is what makes it one's plugin


def test_a_framework_plugin_over_its_capture_budget_is_named_and_kept(tmp_path, monkeypatch, caplog):
    """Dropping a framework's plugin would lose every tensor only it can read (a GPU's) for the rest of
    the run: a slow call of it is said once, and it goes on answering."""
    monkeypatch.setenv("SMDEBUG_PLUGIN_TIMEOUT", "0.2")
    slow = SlowFramework(seconds=1.5)  # its first call takes 1.5 s, over the 1.2 s budget
    plugins.get_plugin_manager().register(slow, name="slow-framework")
    trial = _saved_run(str(tmp_path / "run"), [np.array([float(v)]) for v in range(3)])
    assert slow.calls == 3 and [trial.tensor("w").value(s)[0] for s in range(3)] == [0, 1, 2]
    logged = [r.getMessage() for r in caplog.records if "'slow-framework'" in r.getMessage()]
    assert len(logged) == 1 and "is slow in smdebug_to_numpy" in logged[0], logged
    assert "called again" in logged[0] and "not called there again" not in logged[0], logged


class UndefinedReductionPlugin:
    """Reduces Lazy values itself; an empty one has no max: ValueError, the contract's "undefined"."""

    def __init__(self):
        self.calls = 0

    @hookimpl
    def smdebug_to_numpy(self, value):
        return value.data.copy() if isinstance(value, Lazy) else None

    @hookimpl
    def smdebug_reduce(self, value, reduction, abs):
        if not isinstance(value, Lazy):
            return None
        self.calls += 1
        if not value.data.size:
            raise ValueError(f"the {reduction} of an empty tensor is undefined")
        return numpy_reduction(value.data, reduction, abs)


@pytest.mark.parametrize("trace", ["0", "1"], ids=["plain", "traced"])
def test_a_value_error_from_smdebug_reduce_means_undefined_not_a_failing_plugin(
    tmp_path, caplog, monkeypatch, trace
):
    monkeypatch.setenv("SMDEBUG_TRACE_PLUGINS", trace)  # traced: every call goes through pluggy
    plugins.reset()
    plugin = UndefinedReductionPlugin()
    plugins.get_plugin_manager().register(plugin, name="undefined")
    caplog.set_level("INFO", logger="smdebug")
    hook = BaseHook(
        out_dir=str(tmp_path / "run"),
        save_config=smdebug.SaveConfig(save_interval=1),
        reduction_config=smdebug.ReductionConfig(reductions=["max"]),
        include_regex=["^t"],
    )
    for step in range(2):
        hook.begin_step()
        hook.save_for_step("t_empty", Lazy([]))
        hook.save_for_step("t_full", Lazy([step, -3.0]))
        hook.end_step()
    hook.close()
    assert "failed in smdebug_reduce" not in caplog.text and "undefined' failed" not in caplog.text
    assert "no reductions of t_empty: the max of an empty tensor is undefined" in caplog.text
    trial = create_trial(str(tmp_path / "run"))
    # the plugin was neither skipped nor replaced: it reduced every value, the later full ones too
    assert plugin.calls == 4 and trial.tensor("t_full").reduction_value(1, "max") == 1.0
    assert trial.tensor("t_full").reduction_value(0, "max") == 0.0
