"""The plugin contract, checked for every framework plugin installed in this session's venv (each plugin's
nox session runs this module beside its own tests): torch, xgboost, tensorflow, mxnet and the third-party
toy plugin alike.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

import smdebug
from smdebug import plugins
from smdebug.plugin import BaseHook, Framework, SaveConfig, hookimpl
from smdebug.trials import create_trial

CORE = Path(smdebug.__file__).parent
# What a plugin may import of the core: its plugin API, and the user-facing APIs (rules, trials, errors).
ALLOWED_CORE_IMPORTS = (
    "smdebug.plugin",
    "smdebug.rules",
    "smdebug.trials",
    "smdebug.exceptions",
    "smdebug.modes",
)
DATA = np.array([[1.0, -2.5], [3.0, 0.5]], dtype=np.float32)


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=plugins.ENTRY_POINT_GROUP)}


def _framework_plugins() -> list[str]:
    plugins.reset()
    try:
        return sorted(plugins.frameworks())
    finally:
        plugins.reset()


ALIASES = _framework_plugins()
pytestmark = pytest.mark.skipif(not ALIASES, reason="no framework plugin is installed in this venv")


def sample(alias: str):
    """A value of the plugin's framework holding DATA (a framework with no tensor type of its own,
    like XGBoost's callbacks, hands the hook numpy arrays)."""
    if alias == "pytorch":
        import torch

        return torch.tensor(DATA)
    if alias == "tensorflow":
        import tensorflow as tf

        return tf.constant(DATA)
    if alias == "mxnet":
        import mxnet as mx

        return mx.nd.array(DATA)
    if alias == "toyml":
        import toyml

        return toyml.Array(DATA)
    return DATA.copy()


def hook_class(alias: str) -> type[BaseHook]:
    return importlib.import_module(f"smdebug.{alias}").Hook


@pytest.fixture(params=ALIASES)
def alias(request) -> str:
    return request.param


def test_declares_its_framework(alias):
    fw = plugins.frameworks()[alias]
    assert isinstance(fw, Framework)
    assert importlib.util.find_spec(fw.package) is not None
    assert fw.import_names, "a framework plugin names the imports that activate it"
    assert fw.installed_version() is not None and fw.version_problem() is None


def test_entry_point_module_does_not_import_the_framework(alias):
    fw = plugins.frameworks()[alias]
    ep = next(ep for ep in _entry_points().values() if ep.value.split(":")[0].startswith(fw.package))
    code = (
        f"import sys, {ep.value.split(':')[0]}\n"
        f"print([n for n in {list(fw.import_names)!r} if n in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_alias_import_gives_the_smdebug_1_0_api(alias):
    module = importlib.import_module(f"smdebug.{alias}")
    assert module is importlib.import_module(plugins.frameworks()[alias].package)
    assert issubclass(module.Hook, BaseHook)
    for name in (
        "get_hook",
        "set_hook",
        "del_hook",
        "modes",
        "SaveConfig",
        "ReductionConfig",
        "create_trial",
    ):
        assert hasattr(module, name), name


def test_capture_and_reduction_round_trip(alias):
    value = sample(alias)
    np.testing.assert_array_equal(np.asarray(plugins.to_numpy(value), dtype=np.float32), DATA)
    for reduction in ("max", "mean", "l2"):
        got = plugins.reduce(value, reduction, abs=True)
        expected = {"max": 3.0, "mean": np.abs(DATA).mean(), "l2": np.linalg.norm(DATA)}[reduction]
        assert float(got) == pytest.approx(float(expected), rel=1e-6)


def test_a_saved_tensor_appears_in_its_collections_file(alias, out_dir):
    hook = hook_class(alias)(
        out_dir=out_dir, save_config=SaveConfig(save_interval=1), include_collections=["custom"]
    )
    hook.get_collection("custom").include("^contract_tensor$")
    hook.begin_step()
    assert hook.save_for_step("contract_tensor", sample(alias))
    hook.end_step()
    hook.close()
    files = list(Path(out_dir, "collections", "000000000").glob("*_collections.json"))
    collections = json.loads(files[0].read_text())["collections"]
    assert "contract_tensor" in collections["custom"]["tensor_names"]
    trial = create_trial(out_dir)
    np.testing.assert_array_equal(trial.tensor("contract_tensor").value(0), DATA)
    assert trial.training_ended()


def _private_core_names() -> set[str]:
    """Underscored attributes and functions of the core (anything a plugin must not reach for)."""
    names = set()
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name.startswith("_"):
                if not node.name.startswith("__"):
                    names.add(node.name)
    return names


def test_plugin_uses_only_the_public_core_api(alias):
    package = plugins.frameworks()[alias].package
    folder = Path(importlib.util.find_spec(package).origin).parent
    sources = {path: ast.parse(path.read_text()) for path in folder.rglob("*.py")}
    own = {  # private names the plugin defines itself (its own attributes and helpers)
        n.attr if isinstance(n, ast.Attribute) else n.name
        for tree in sources.values()
        for n in ast.walk(tree)
        if (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store))
        or isinstance(n, (ast.FunctionDef, ast.ClassDef))
    }
    forbidden = _private_core_names() - own
    problems = []
    for path, tree in sources.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in forbidden:
                problems.append(f"{path.name}:{node.lineno} uses the core's private {node.attr}")
            modules = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            for module in modules:
                if module.split(".")[0] == "smdebug" and module != "smdebug":
                    if not module.startswith(ALLOWED_CORE_IMPORTS) and not module.startswith(
                        f"smdebug.{alias}"
                    ):
                        problems.append(f"{path.name}:{node.lineno} imports {module}")
    assert not problems, "\n".join(problems)


class Misbehaving:
    """A plugin whose every per-call hook raises (registered first in line, the worst case)."""

    calls = 0

    def _fail(self, hook_name):
        Misbehaving.calls += 1
        raise RuntimeError(f"misbehaving plugin fails in {hook_name}")

    @hookimpl(tryfirst=True)
    def smdebug_to_numpy(self, value):
        self._fail("to_numpy")

    @hookimpl(tryfirst=True)
    def smdebug_reduce(self, value, reduction, abs):
        self._fail("reduce")

    @hookimpl(tryfirst=True)
    def smdebug_open_store(self, uri):
        self._fail("open_store")

    @hookimpl
    def smdebug_step_begin(self, hook, mode, step, mode_step):
        self._fail("step_begin")

    @hookimpl
    def smdebug_step_end(self, hook, mode, step, mode_step):
        self._fail("step_end")

    @hookimpl
    def smdebug_tensor_saved(self, hook, name, value, step, mode):
        self._fail("tensor_saved")

    @hookimpl
    def smdebug_hook_closed(self, hook):
        self._fail("hook_closed")


def test_a_misbehaving_plugin_breaks_nothing(alias, out_dir, caplog):
    from smdebug.plugin import ReductionConfig

    plugins.get_plugin_manager().register(Misbehaving(), name="misbehaving")
    steps = 4
    hook = hook_class(alias)(
        out_dir=out_dir,
        save_config=SaveConfig(save_interval=1),
        include_collections=["custom"],
    )
    hook.get_collection("custom").include("^(framework|host)_value$")
    # (the collection's own: the XGBoost hook ignores a hook-level reduction_config, as smdebug 1.0)
    hook.get_collection("custom").reduction_config = ReductionConfig(
        reductions=["max", "mean"], save_raw_tensor=True
    )
    for _ in range(steps):  # a training loop as a plugin drives it
        hook.begin_step()
        hook.save_for_step("framework_value", sample(alias))
        hook.save_for_step("host_value", DATA.copy())
        hook.end_step()
    hook.close()

    trial = create_trial(out_dir)
    for name in ("framework_value", "host_value"):
        tensor = trial.tensor(name)
        assert tensor.steps() == list(range(steps))
        for step in range(steps):
            np.testing.assert_array_equal(tensor.value(step), DATA)
            assert float(tensor.reduction_value(step, "max")) == pytest.approx(3.0)
            assert float(tensor.reduction_value(step, "mean")) == pytest.approx(float(DATA.mean()))
    assert Misbehaving.calls > steps * 4  # it was called, and failed, at every turn
    logged = [r.getMessage() for r in caplog.records if "'misbehaving'" in r.getMessage()]
    assert len(logged) == len(set(logged)) == 7  # once per hook specification, never per call
    assert all("is skipped" in m for m in logged)


def test_set_hook_and_del_hook(alias, out_dir):
    smd = importlib.import_module(f"smdebug.{alias}")
    first = smd.Hook(out_dir=out_dir, dry_run=True)
    second = smd.Hook(out_dir=out_dir, dry_run=True)
    assert smd.get_hook() is second  # the last one created
    smd.set_hook(first)
    assert smd.get_hook() is first
    smd.del_hook()
    assert smd.get_hook() is None
