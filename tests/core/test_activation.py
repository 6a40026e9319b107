"""Activation on framework import (smdebug.activation) and `smdebug run`, without any framework.

The post-import hook is exercised on a real module written to a temporary folder, with plugins registered
on the real PluginManager. The startup file itself is checked in the sessions that install the core
afresh (tests/thirdparty, tests/torch), where real subprocesses train with it.
"""

import importlib
import json
import logging
import os
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

from smdebug import activation, plugins
from smdebug.hookspecs import hookimpl
from smdebug.json_config import CONFIG_FILE_PATH_ENV, DEFAULT_CONFIG_PATH
from smdebug.plugins import Framework

SMDEBUG_CLI = str(Path(sys.executable).with_name("smdebug"))


class ToyPlugin:
    """A framework plugin for the module `toyfw_<n>` written by the fixture."""

    def __init__(self, import_name, supported="", fail=False):
        self.import_name = import_name
        self.supported = supported
        self.fail = fail
        self.calls = []

    @hookimpl
    def smdebug_framework(self):
        return Framework(
            alias=self.import_name,
            package="toy",
            import_names=(self.import_name,),
            distribution="numpy" if self.supported else None,
            supported=self.supported,
        )

    @hookimpl
    def smdebug_activate(self, framework, module):
        if framework.alias != self.import_name:
            return None
        # the module has run completely when activation sees it
        self.calls.append((module.__name__, module.DONE))
        if self.fail:
            raise RuntimeError("cannot attach to the framework")
        return f"hook for {module.__name__}"


@pytest.fixture
def toy(tmp_path, monkeypatch, request):
    """A fresh importable module and a registered plugin that watches it."""
    name = f"toyfw_{abs(hash(request.node.name)) % 10**8}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("DONE = False\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = ToyPlugin(name, **getattr(request, "param", {}))
    plugins.get_plugin_manager().register(plugin, name=name)
    yield plugin
    activation.uninstall()
    sys.modules.pop(name, None)


def test_disabled_reason(monkeypatch):
    monkeypatch.delenv("SMDEBUG_DISABLE", raising=False)
    monkeypatch.delenv("USE_SMDEBUG", raising=False)
    assert activation.disabled_reason() is None
    monkeypatch.setenv("SMDEBUG_DISABLE", "0")
    assert activation.disabled_reason() is None
    monkeypatch.setenv("SMDEBUG_DISABLE", "1")
    assert activation.disabled_reason() == "SMDEBUG_DISABLE=1"
    monkeypatch.delenv("SMDEBUG_DISABLE")
    monkeypatch.setenv("USE_SMDEBUG", "False")
    assert activation.disabled_reason() == "USE_SMDEBUG=False"
    monkeypatch.setenv("USE_SMDEBUG", "1")
    assert activation.disabled_reason() is None


def test_configured_by_env(monkeypatch, tmp_path):
    assert (activation.CONFIG_FILE_PATH_ENV, activation.DEFAULT_CONFIG_PATH) == (
        CONFIG_FILE_PATH_ENV,
        DEFAULT_CONFIG_PATH,
    )
    monkeypatch.delenv(CONFIG_FILE_PATH_ENV, raising=False)
    assert activation.configured() is Path(DEFAULT_CONFIG_PATH).is_file()
    monkeypatch.setenv(CONFIG_FILE_PATH_ENV, str(tmp_path / "c.json"))
    assert activation.configured()


def test_activates_once_right_after_import(toy):
    assert toy.import_name in activation.install()
    module = importlib.import_module(toy.import_name)
    assert toy.calls == [(toy.import_name, True)]
    assert activation.activated()[toy.import_name] == f"hook for {toy.import_name}"
    # the framework keeps its own loader, with no trace of the wrapping
    assert type(module.__loader__) is SourceFileLoader and "exec_module" not in vars(module.__loader__)
    importlib.reload(module)
    assert len(toy.calls) == 1


def test_framework_imported_before_install_activates_at_install(toy):
    importlib.import_module(toy.import_name)
    assert toy.calls == []
    activation.install()
    assert toy.calls == [(toy.import_name, True)]


def test_after_import_calls_back_once_a_submodule_has_run(toy, tmp_path, caplog):
    """A plugin attaching to a submodule its framework's import does not load (xgboost.dask)."""
    (tmp_path / toy.import_name / "sub.py").write_text("DONE = False\nDONE = True\n")
    (tmp_path / toy.import_name / "bad.py").write_text("DONE = True\n")
    seen = []
    importlib.import_module(toy.import_name)
    activation.after_import(toy.import_name, lambda m: seen.append(("already", m.__name__)))
    activation.after_import(f"{toy.import_name}.sub", lambda m: seen.append(("later", m.__name__, m.DONE)))
    activation.after_import(f"{toy.import_name}.bad", lambda m: 1 / 0)
    assert seen == [("already", toy.import_name)]
    importlib.import_module(f"{toy.import_name}.sub")
    importlib.import_module(f"{toy.import_name}.sub")  # once
    assert seen[1:] == [("later", f"{toy.import_name}.sub", True)]
    caplog.set_level(logging.WARNING, logger="smdebug")
    assert importlib.import_module(f"{toy.import_name}.bad").DONE  # the import goes on
    assert f"after the import of {toy.import_name}.bad: ZeroDivisionError" in caplog.text
    for sub in ("sub", "bad"):
        sys.modules.pop(f"{toy.import_name}.{sub}", None)


@pytest.mark.parametrize("toy", [{"supported": ">=999"}], indirect=True)
def test_unsupported_version_skips_with_one_line(toy, caplog):
    activation.install()
    importlib.import_module(toy.import_name)
    assert toy.calls == []
    lines = [r.getMessage() for r in caplog.records if r.name == "smdebug" and r.levelno >= logging.WARNING]
    assert len(lines) == 1
    assert f"not activating {toy.import_name}" in lines[0] and "outside the supported range >=999" in lines[0]


@pytest.mark.parametrize("toy", [{"fail": True}], indirect=True)
def test_error_in_activation_is_logged_and_import_succeeds(toy, caplog):
    activation.install()
    module = importlib.import_module(toy.import_name)
    assert module.DONE and toy.calls == [(toy.import_name, True)]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "cannot attach to the framework" in lines[0]
    assert toy.import_name not in activation.activated()


def test_a_plugin_raising_does_not_stop_the_others(toy, caplog):
    class Broken:
        @hookimpl
        def smdebug_framework(self):
            raise RuntimeError("no framework here")

        @hookimpl(tryfirst=True)
        def smdebug_activate(self, framework, module):
            raise RuntimeError("broken activation")

    plugins.get_plugin_manager().register(Broken(), name="broken-toy")
    assert toy.import_name in plugins.frameworks()
    activation.install()
    importlib.import_module(toy.import_name)
    assert activation.activated()[toy.import_name] == f"hook for {toy.import_name}"
    broken = [r.getMessage() for r in caplog.records if "broken-toy" in r.getMessage()]
    # its smdebug_activate is never called: only the plugin that declared the framework activates it
    assert len(broken) == 1
    assert "smdebug_framework" in broken[0]


def test_startup_respects_disable(toy, monkeypatch):
    monkeypatch.setenv("SMDEBUG_DISABLE", "1")
    activation.startup()
    importlib.import_module(toy.import_name)
    assert toy.calls == []


def test_startup_never_raises(monkeypatch, caplog):
    def boom():
        raise RuntimeError("plugin manager exploded")

    monkeypatch.setattr(plugins, "frameworks", boom)
    monkeypatch.delenv("SMDEBUG_DISABLE", raising=False)
    monkeypatch.delenv("USE_SMDEBUG", raising=False)
    activation.startup()
    assert "activation could not start: RuntimeError: plugin manager exploded" in caplog.text


# -- the startup file's line, run as the interpreter runs it (site.addpackage execs lines starting "import")
PTH = Path(__file__).parents[2] / "core" / "zz-smdebug-activation.pth"


@pytest.mark.parametrize("configured", [False, True])
def test_startup_line_imports_nothing_unless_configured(configured, tmp_path):
    (line,) = [x for x in PTH.read_text().splitlines() if x.startswith("import ")]
    # The interpreter starts unconfigured (so the installed startup file did nothing), then the line runs
    # again with or without a configuration.
    setenv = (
        f"os.environ['SMDEBUG_CONFIG_FILE_PATH'] = {str(tmp_path / 'hook.json')!r}; " if configured else ""
    )
    code = (
        f"import os, sys; {setenv}before = set(sys.modules); exec({line!r}); "
        "new = sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('smdebug', 'pluggy')); "
        "print(bool(new), [type(f).__name__ for f in sys.meta_path if 'PostImport' in type(f).__name__])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SMDEBUG_CONFIG_FILE_PATH", "SMDEBUG_DISABLE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    on = configured or Path(DEFAULT_CONFIG_PATH).is_file()  # (on SageMaker, always configured)
    expected = "True ['_PostImportFinder']" if on else "False []"
    assert out.stdout.strip() == expected


# -- smdebug run (the command is a plain python child here; frameworks are in their plugins' sessions) --
CHILD = (
    "import json, os, sys; p = os.environ['SMDEBUG_CONFIG_FILE_PATH']; "
    "print(json.dumps(json.load(open(p)))); sys.exit(int(sys.argv[1]))"
)


def _run(*args, **kwargs):
    return subprocess.run([SMDEBUG_CLI, "run", *args], capture_output=True, text=True, **kwargs)


def test_run_hands_the_configuration_to_the_command(tmp_path):
    out = tmp_path / "run"
    done = _run(
        "--out-dir", str(out), "--collections", "weights,gradients", "losses", "--save-interval", "3",
        "--", "python", "-c", CHILD, "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout.splitlines()[0])
    assert config == {
        "LocalPath": str(out),
        "HookParameters": {"save_interval": "3"},
        "CollectionConfigurations": [
            {"CollectionName": "weights"},
            {"CollectionName": "gradients"},
            {"CollectionName": "losses"},
        ],
    }
    assert f"saving to {out}" in done.stderr
    assert "nothing was saved" in done.stderr  # the child imported no framework


def test_run_health_steps_turns_health_on(tmp_path):
    done = _run("--out-dir", str(tmp_path / "o"), "--health-steps", "20", "--", "python", "-c", CHILD, "0")
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout.splitlines()[0])
    assert config["HookParameters"] == {"health_steps": "20", "health": "true"}


def test_run_completes_a_config_file_and_returns_the_exit_code(tmp_path):
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"LocalPath": "ignored", "HookParameters": {"reductions": "max"}}))
    done = _run("--config", str(config), "--out-dir", str(tmp_path / "o"), "--", "python", "-c", CHILD, "3")
    assert done.returncode == 3
    assert json.loads(done.stdout.splitlines()[0]) == {
        "LocalPath": str(tmp_path / "o"),
        "HookParameters": {"reductions": "max"},
    }


def test_run_save_interval_is_every_modes_over_the_configurations(tmp_path):
    config = tmp_path / "hook.json"
    hook = {"global.save_interval": "100", "TRAIN.save_interval": "50", "eval.save_steps": "1"}
    config.write_text(json.dumps({"LocalPath": "x", "HookParameters": hook}))
    done = _run("--config", str(config), "--save-interval", "2", "--", "python", "-c", CHILD, "0")
    assert done.returncode == 0, done.stderr
    given = json.loads(done.stdout.splitlines()[0])["HookParameters"]
    assert given == {"eval.save_steps": "1", "save_interval": "2"}


def test_run_default_out_dir_is_new_and_absolute(tmp_path):
    done = _run("--", "python", "-c", CHILD, "0", cwd=tmp_path)
    local = Path(json.loads(done.stdout.splitlines()[0])["LocalPath"])
    assert local.is_absolute() and local.parent == tmp_path / "smdebug-runs"


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "give the command to run after --"),
        (
            ["--save-interval", "0", "--", "python", "-c", "pass"],
            "--save-interval: expected a positive number",
        ),
        (["--health-steps", "0", "--", "python", "-c", "pass"], "--health-steps: expected a positive number"),
        (["--config", "/no/such.json", "--", "python", "-c", "pass"], "/no/such.json: cannot read"),
        (["--", "no-such-command-xyz"], "cannot run 'no-such-command-xyz'"),
    ],
)
def test_run_errors_are_one_clear_line(args, message):
    done = _run(*args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_run_bad_configuration_is_refused_before_running(tmp_path):
    config = tmp_path / "hook.json"
    config.write_text(
        json.dumps({"LocalPath": str(tmp_path / "o"), "HookParameters": {"save_intervall": "2"}})
    )
    done = _run("--config", str(config), "--", "python", "-c", "print('ran')")
    assert done.returncode == 2 and "ran" not in done.stdout
    assert "HookParameters.save_intervall: unknown key" in done.stderr


def test_run_refuses_a_finished_run(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "training_job_end.ts").write_text("")
    done = _run("--out-dir", str(tmp_path / "o"), "--", "python", "-c", "print('ran')")
    assert done.returncode == 2 and "already holds a finished smdebug run" in done.stderr


class SecondClaim(ToyPlugin):
    """Another plugin serving the toy's import under an alias of its own."""

    @hookimpl
    def smdebug_framework(self):
        return Framework(alias=self.import_name + "_again", package="again", import_names=(self.import_name,))

    @hookimpl
    def smdebug_activate(self, framework, module):
        self.calls.append(framework.alias)
        return "a second hook"


def test_two_plugins_claiming_one_framework_import_activate_it_once(toy, caplog):
    """Two plugins serving the same import (under two aliases) were both activated: both attached a hook
    built from the one configuration (the same hook twice, every step counted twice; or a second hook
    refused as another writer of the run, which stopped the script with exit code 2)."""
    again = SecondClaim(toy.import_name)
    plugins.get_plugin_manager().register(again, name="again")
    for _ in range(2):
        activation.install()
    importlib.import_module(toy.import_name)
    activated = activation.activated()
    assert len(toy.calls) + len(again.calls) == 1, (toy.calls, again.calls)
    assert [alias for alias in activated if alias.startswith(toy.import_name)] == [toy.import_name + "_again"]
    winner, loser = ("again", toy.import_name) if again.calls else (toy.import_name, "again")
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == [
        f"smdebug: plugins {winner!r} and {loser!r} both serve the import of {toy.import_name}; only "
        f"{winner!r} is activated (SMDEBUG_DISABLE_PLUGINS={winner} activates the other)"
    ], lines


class SlowToy(ToyPlugin):
    @hookimpl
    def smdebug_activate(self, framework, module):
        import time

        time.sleep(1.0)
        return super().smdebug_activate(framework, module)


def test_an_activation_that_stalls_is_named_while_it_runs(toy, monkeypatch, caplog):
    """A plugin whose smdebug_activate stalled the framework's import without a word (it must run inside
    the import, so it cannot be left behind): one line names it once the plugin timeout has passed."""
    monkeypatch.setenv("SMDEBUG_PLUGIN_TIMEOUT", "0.05")  # six times over: 0.3 s
    pm = plugins.get_plugin_manager()
    pm.unregister(name=toy.import_name)
    slow = SlowToy(toy.import_name)
    pm.register(slow, name=toy.import_name)
    activation.install()
    importlib.import_module(toy.import_name)
    assert slow.calls == [(toy.import_name, True)]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == [
        f"smdebug: plugin {toy.import_name!r} has not returned from smdebug_activate for 0.3 s; the import "
        f"of {toy.import_name} waits for it (SMDEBUG_DISABLE_PLUGINS={toy.import_name} turns it off)"
    ], lines
