"""The plugin contract, proven by a third party: the toy framework toyml (tests/thirdparty/toyml), its
plugin smdebug-toyml, and a broken plugin smdebug-toybroken are real distributions, pip installed (not
editable) into this session's venv by nox. Nothing here is registered by hand: everything goes through
the `smdebug` entry points, as it would for a plugin published on PyPI.
"""

import dataclasses
import json
import logging
import os
import shutil
import site
import subprocess
import sys
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import toyml

import smdebug
from smdebug import activation, plugins
from smdebug.trials import create_trial

SMDEBUG_CLI = str(Path(sys.executable).with_name("smdebug"))
HERE = Path(__file__).parent

# An unmodified toyml training script: no smdebug import. It prints the loss of each step as JSON.
TRAIN = textwrap.dedent(
    """
    import json
    import numpy as np
    import toyml

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3))
    y = x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3
    model = toyml.Linear(3, 1)
    print(json.dumps(toyml.fit(model, x, y, epochs=2, lr=0.1, batch_size=32)))
    """
)


@pytest.fixture(autouse=True)
def fresh_plugins():
    plugins.reset()
    yield
    plugins.reset()
    activation.uninstall()


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("SMDEBUG_DISABLE", "USE_SMDEBUG")}
    env.pop("SMDEBUG_CONFIG_FILE_PATH", None)
    env.update(extra)
    return env


def _config(tmp_path, out, **hook_params):
    path = tmp_path / "hook.json"
    path.write_text(
        json.dumps(
            {
                "LocalPath": str(out),
                "HookParameters": {"save_interval": "1", **hook_params},
                "CollectionConfigurations": [
                    {"CollectionName": c} for c in ("weights", "gradients", "losses")
                ],
            }
        )
    )
    return path


def _train(tmp_path, env, *prefix):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    command = [*prefix, "--", "python", str(script)] if prefix else [sys.executable, str(script)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


# -- installation and discovery --------------------------------------------------------------------------
def test_distributions_are_installed_not_editable():
    for dist in ("toyml", "smdebug-toyml", "smdebug-toybroken"):
        files = [str(f) for f in metadata.distribution(dist).files]
        assert not any("__editable__" in f for f in files), dist
    import smdebug_toyml

    assert HERE not in Path(smdebug_toyml.__file__).parents


def test_startup_file_is_installed_by_the_core():
    pth = [Path(d) / "zz-smdebug-activation.pth" for d in site.getsitepackages()]
    assert any(p.is_file() for p in pth), "the core did not install zz-smdebug-activation.pth"
    assert "zz-smdebug-activation.pth" in {
        Path(str(f)).name for f in metadata.distribution("smdebug-core").files
    }


def test_core_wheel_carries_the_startup_file(tmp_path):
    # a plain `pip install ./core` installs the wheel built here (a copy: no build files in the checkout)
    src = tmp_path / "core"
    shutil.copytree(HERE.parent.parent / "core", src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path, src],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("smdebug_core-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("zz-smdebug-activation.pth") == (src / "zz-smdebug-activation.pth").read_bytes()
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        assert "zz-smdebug-activation.pth,sha256=" in zf.read(record).decode()


def test_discovery_through_the_entry_point():
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="smdebug")}
    assert eps["toyml"] == "smdebug_toyml.plugin"
    fw = plugins.frameworks()["toyml"]
    assert (fw.package, fw.import_names, fw.distribution, fw.supported) == (
        "smdebug_toyml",
        ("toyml",),
        "toyml",
        ">=1.0,<2",
    )
    assert fw.version_problem() is None


def test_alias_import():
    import smdebug_toyml

    import smdebug.toyml as smd

    assert smd is smdebug_toyml and smdebug.toyml is smdebug_toyml
    from smdebug.toyml.hook import Hook

    assert smd.Hook is Hook and issubclass(Hook, smdebug.BaseHook)


# -- capture through the hookspecs -----------------------------------------------------------------------
def test_capture_and_reduction_through_the_hooks():
    from smdebug_toyml import plugin

    value = toyml.Array([[1.0, -4.0], [2.0, 3.0]])
    array = plugins.to_numpy(value)
    assert isinstance(array, np.ndarray) and array.tolist() == [[1.0, -4.0], [2.0, 3.0]]
    plugin.REDUCED_HERE.clear()
    assert plugins.reduce(value, "max", abs=True) == 4.0 and plugin.REDUCED_HERE == ["max"]
    assert plugins.reduce(value, "min") == -4.0  # the core's, from smdebug_to_numpy's array


def test_explicit_hook_saves_what_toyml_computes(tmp_path):
    import smdebug.toyml as smd

    out = str(tmp_path / "run")
    hook = smd.Hook(
        out_dir=out,
        save_config=smd.SaveConfig(save_interval=2),
        include_collections=["weights", "gradients", "losses"],
        reduction_config=smd.ReductionConfig(
            reductions=["max"], abs_reductions=["max"], save_raw_tensor=True
        ),
    )
    seen = []

    class Record:
        def on_step_begin(self, step):
            pass

        def on_step_end(self, step, logs):
            seen.append({k: v.data.copy() for k, v in logs["params"].items()} | {"loss": logs["loss"].data})

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(32, 2)), rng.normal(size=(32, 1))
    toyml.fit(toyml.Linear(2, 1), x, y, epochs=1, lr=0.1, batch_size=8, callbacks=[hook, Record()])
    hook.close()

    trial = create_trial(out)
    assert trial.steps() == [0, 2]
    assert trial.tensor_names(collection="weights") == ["weight"]
    assert set(trial.tensor_names(collection="gradients")) == {"gradients/weight", "gradients/bias"}
    for step in (0, 2):
        np.testing.assert_array_equal(trial.tensor("weight").value(step), seen[step]["weight"])
        assert trial.tensor("loss").value(step).item() == pytest.approx(float(seen[step]["loss"]))
        assert trial.tensor("weight").reduction_value(step, "max", abs=True) == pytest.approx(
            np.abs(seen[step]["weight"]).max()
        )


# -- activation on `import toyml`, in real subprocesses ----------------------------------------------
def test_activation_under_config_file_env(tmp_path):
    out = tmp_path / "run"
    done = _train(tmp_path, _env(SMDEBUG_CONFIG_FILE_PATH=str(_config(tmp_path, out))))
    assert done.returncode == 0, done.stderr
    losses = json.loads(done.stdout)
    trial = create_trial(str(out))
    assert trial.steps() == [0, 1, 2, 3]
    # the collections configured: weights (not biases), gradients, losses
    assert set(trial.tensor_names()) == {"weight", "gradients/weight", "gradients/bias", "loss"}
    saved = [trial.tensor("loss").value(s).item() for s in trial.steps()]
    np.testing.assert_allclose(saved, losses)


def test_activation_under_smdebug_run(tmp_path):
    out = tmp_path / "run"
    done = _train(
        tmp_path, _env(), SMDEBUG_CLI, "run", "--out-dir", str(out), "--collections", "losses,weights"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"smdebug run: run saved to {out}"
    losses = json.loads(done.stdout.splitlines()[0])
    trial = create_trial(str(out))
    assert trial.steps() == [0]  # the default save_interval (500)
    assert trial.tensor("loss").value(0).item() == pytest.approx(losses[0])
    assert trial.tensor_names(collection="weights") == ["weight"]


def test_get_hook_and_save_scalar_in_an_activated_script(tmp_path):
    out = tmp_path / "run"
    script = tmp_path / "train.py"
    script.write_text(TRAIN + "import smdebug.toyml as smd\nsmd.get_hook().save_scalar('answer', 42)\n")
    env = _env(SMDEBUG_CONFIG_FILE_PATH=str(_config(tmp_path, out)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    trial = create_trial(str(out))
    assert trial.tensor("scalar/answer").value(3).item() == 42


@pytest.mark.parametrize("switch", [{"SMDEBUG_DISABLE": "1"}, {"USE_SMDEBUG": "0"}])
def test_disable_switches(tmp_path, switch):
    out = tmp_path / "run"
    done = _train(tmp_path, _env(SMDEBUG_CONFIG_FILE_PATH=str(_config(tmp_path, out)), **switch))
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 4 and not out.exists()


def test_nothing_of_smdebug_is_imported_without_configuration(tmp_path):
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import toyml"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line]
    assert "toyml" in imported
    assert not [name for name in imported if name.startswith(("smdebug", "pluggy"))]


def test_unsupported_version_skips_activation_with_one_line(caplog):
    fw = plugins.frameworks()["toyml"]
    with caplog.at_level(logging.INFO, logger="smdebug"):
        assert activation.activate(dataclasses.replace(fw, supported=">=2"), toyml) is None
    assert [r.getMessage() for r in caplog.records if "activating" in r.getMessage()] == [
        "smdebug: not activating toyml on import of toyml: toyml 1.3.0 is outside the supported range >=2"
    ]


def test_activation_with_a_bad_configuration_stops_with_one_line(tmp_path):
    """smdebug was asked for (SMDEBUG_CONFIG_FILE_PATH) and its configuration is wrong: the script stops
    before training, exit code 2, as `smdebug run --config` does with the same file."""
    out = tmp_path / "run"
    config = _config(tmp_path, out, reductions="maxx")
    done = _train(tmp_path, _env(SMDEBUG_CONFIG_FILE_PATH=str(config)))
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and not out.exists() and "Traceback" not in done.stderr
    failed = [line for line in done.stderr.splitlines() if "bad hook configuration" in line]
    assert len(failed) == 1 and "maxx" in failed[0] and str(config) in failed[0]


# -- a broken third-party plugin ---------------------------------------------------------------------
def test_broken_plugin_does_not_break_the_others(caplog):
    assert set(plugins.frameworks()) == {"toyml"}  # toybroken's two entry points declare nothing
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'toybroken-missing' (smdebug-toybroken) failed to load" in m for m in messages)
    assert any("'toybroken' failed in smdebug_framework" in m for m in messages)
    import smdebug.toyml  # noqa: F401  (the alias still resolves)


def test_broken_plugin_does_not_stop_activation_in_a_subprocess(tmp_path):
    out = tmp_path / "run"
    done = _train(tmp_path, _env(SMDEBUG_CONFIG_FILE_PATH=str(_config(tmp_path, out))))
    assert done.returncode == 0, done.stderr
    assert create_trial(str(out)).steps() == [0, 1, 2, 3]
    warnings = [line for line in done.stderr.splitlines() if "toybroken" in line]
    # two failed to load; failed in smdebug_framework, smdebug_to_numpy, smdebug_step_end: each said once
    assert len(warnings) == 5, done.stderr
    assert any("toybroken fails at the end of step" in w for w in warnings)


def test_a_misspelled_hook_refuses_the_plugin_and_names_the_real_hook(caplog):
    assert "toytypo" not in plugins.frameworks()  # nothing of the plugin is registered
    assert not plugins.get_plugin_manager().has_plugin("toybroken-typo")
    error = plugins.load_errors["toybroken-typo"]
    assert error.startswith("PluginValidationError: plugin 'toybroken-typo' implements 'smdebug_to_numpyy'")
    assert "did you mean 'smdebug_to_numpy'?" in error
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'toybroken-typo' (smdebug-toybroken) failed to load" in m for m in messages)
    assert plugins.to_numpy(toyml.Array([1.0, 2.0])).tolist() == [1.0, 2.0]  # the others work


def test_smdebug_plugins_lists_third_party_plugins():
    done = subprocess.run([SMDEBUG_CLI, "plugins", "--json"], capture_output=True, text=True, env=_env())
    assert done.returncode == 0, done.stderr
    listed = {p["name"]: p for p in json.loads(done.stdout)}
    toy = listed["toyml"]
    assert (toy["distribution"], toy["version"], toy["error"]) == (
        "smdebug-toyml",
        metadata.version("smdebug-toyml"),
        None,
    )
    assert {"smdebug_framework", "smdebug_to_numpy", "smdebug_reduce", "smdebug_activate"} <= set(
        toy["hooks"]
    )
    assert listed["toybroken"]["hooks"] == ["smdebug_framework", "smdebug_step_end", "smdebug_to_numpy"]
    assert listed["toybroken-missing"]["error"].startswith("ModuleNotFoundError: ")
    assert "smdebug_to_numpyy" in listed["toybroken-typo"]["error"]
    assert listed["toybroken-typo"]["distribution"] == "smdebug-toybroken"

    done = subprocess.run([SMDEBUG_CLI, "plugins"], capture_output=True, text=True, env=_env())
    assert done.returncode == 0, done.stderr
    assert f"toyml  (smdebug-toyml {metadata.version('smdebug-toyml')})" in done.stdout.splitlines()
    assert (
        "  LOAD ERROR: PluginValidationError: plugin 'toybroken-typo' implements 'smdebug_to_numpyy'"
        in done.stdout
    )
