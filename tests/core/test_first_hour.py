"""A new user's typos are caught: a rule that would check nothing, an unknown collection, a trial on
nothing. Runs written by the core's own hook (no framework)."""

import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import smdebug
from smdebug.exceptions import SMDebugValueError
from smdebug.hook import BaseHook
from smdebug.rules.builtin import create_rule
from smdebug.rules.rule_invoker import evaluate_rule, invoke_rule
from smdebug.trials import create_trial


def write_run(out, steps=4):
    hook = BaseHook(
        out_dir=out,
        save_config=smdebug.SaveConfig(save_interval=1),
        include_collections=["weights", "losses"],
    )
    hook.get_collection("weights").include("^weight/")
    hook.get_collection("losses").include("^loss$")
    rng = np.random.default_rng(0)
    for step in range(steps):
        hook.begin_step()
        hook.save_for_step("weight/fc", rng.normal(size=(3, 3)).astype(np.float32))
        hook.save_for_step("loss", np.float32(1.0 / (step + 1)))
        hook.end_step()
    hook.close()
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return write_run(str(tmp_path_factory.mktemp("typos") / "run"))


def smdebug_cli(*args, columns="250"):
    exe = shutil.which("smdebug", path=os.path.dirname(sys.executable)) or "smdebug"
    env = {**os.environ, "COLUMNS": columns}  # the table's width when piped
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)


def test_cli_rule_with_a_misspelled_collection_is_an_error_naming_the_fix(run):
    result = smdebug_cli("rules", run, "--rule", "exploding_tensor", "--param", "collection_names=weigths")
    assert result.returncode == 2, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert "no collection 'weigths'" in out and "did you mean 'weights'" in out
    assert "ok" not in out.split("weigths")[0].split("exploding_tensor")[-1]


def test_cli_rule_whose_regex_matches_nothing_is_not_ok(run):
    result = smdebug_cli("rules", run, "--rule", "exploding_tensor", "--param", "tensor_regex=wieght/.*")
    assert result.returncode == 2, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert "checked nothing" in out and "matched no saved tensor" in out


def test_cli_rule_whose_selection_matches_still_ok(run):
    result = smdebug_cli("rules", run, "--rule", "exploding_tensor", "--param", "tensor_regex=weight/.*")
    assert result.returncode == 0, result.stdout + result.stderr


def test_python_rule_with_a_misspelled_collection_raises(run):
    rule = create_rule("exploding_tensor", create_trial(run), collection_names="weigths")
    with pytest.raises(SMDebugValueError, match="did you mean 'weights'"):
        invoke_rule(rule)


def test_invoke_rule_warns_when_the_rule_checked_nothing(run, caplog):
    caplog.set_level(logging.WARNING, logger="smdebug")
    rule = create_rule("all_zero", create_trial(run), tensor_regex="nothing_like_this")
    assert evaluate_rule(rule) == []
    assert "checked nothing" in caplog.text and "tensor_regex='nothing_like_this'" in caplog.text


def test_include_collections_typo_warns_with_the_fix(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="smdebug")
    hook = BaseHook(out_dir=str(tmp_path / "run"), include_collections=["weigths"])
    hook.begin_step()
    hook.end_step()
    hook.close()
    assert "'weigths'" in caplog.text and "did you mean 'weights'" in caplog.text


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_create_trial_on_nothing_says_so(tmp_path, caplog, kind):
    caplog.set_level(logging.WARNING, logger="smdebug")
    path = tmp_path / "runn"
    if kind == "empty":
        path.mkdir()
    trial = create_trial(str(path))
    assert trial.steps() == []
    expected = "no such file or directory" if kind == "missing" else "no smdebug run found"
    assert expected in caplog.text and str(path) in caplog.text


def test_create_trial_on_a_run_says_nothing(run, caplog):
    caplog.set_level(logging.WARNING, logger="smdebug")
    assert create_trial(run).steps() == [0, 1, 2, 3]
    assert "no such file" not in caplog.text and "no smdebug run" not in caplog.text


# -- smaller edges (issue 33 item 6) ----------------------------------------------------------------------
def write_nan_run(out):
    hook = BaseHook(
        out_dir=out, save_config=smdebug.SaveConfig(save_interval=1), include_collections=["weights"]
    )
    hook.get_collection("weights").include("^weight/")
    for step in range(3):
        hook.begin_step()
        hook.save_for_step("weight/fc", np.full((2, 2), np.nan if step == 2 else 1.0, dtype=np.float32))
        hook.end_step()
    hook.close()
    return out


def test_rules_watch_on_a_finished_run_leaves_no_stop_signal_and_says_so(tmp_path):
    from smdebug.rules.actions import STOP_SIGNAL_FILE

    run = write_nan_run(str(tmp_path / "run"))
    result = smdebug_cli("rules", run, "--watch", "--rule", "exploding_tensor")
    assert result.returncode == 1, result.stdout + result.stderr
    assert not (tmp_path / "run" / STOP_SIGNAL_FILE).exists()
    assert "no stop signal left" in " ".join(result.stdout.split())


def test_rules_table_follows_columns_when_piped(run):
    long = "tensor_regex=" + "no_tensor_is_named_like_this_" * 3  # an error row with a long reason
    result = smdebug_cli("rules", run, "--rule", "all_zero", "--param", long, columns="90")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "checked" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 90


def test_ls_lists_no_empty_collection(run):
    result = smdebug_cli("ls", run)
    assert result.returncode == 0, result.stderr
    assert " 0 tensors" not in result.stdout
    assert "weights" in result.stdout and "losses" in result.stdout


def test_export_tensorboard_without_tensorboard_is_one_coherent_line(run, tmp_path):
    result = smdebug_cli("export-tensorboard", run, str(tmp_path / "logs"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and "install" in lines[0] and "tensorboard --logdir" in lines[0], result.stdout
    assert "view them with" not in lines[0]


def test_a_misspelt_tensor_name_names_the_nearest_saved_one(run):
    import pickle

    from smdebug.exceptions import TensorUnavailable

    trial = create_trial(run)
    with pytest.raises(TensorUnavailable) as info:
        trial.tensor("weight/cf")
    assert str(info.value) == "Tensor weight/cf was not saved; did you mean 'weight/fc'?"
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)  # as a Dask worker sends it
    with pytest.raises(TensorUnavailable, match=r"^Tensor zzz was not saved\.$"):
        trial.tensor("zzz")


@pytest.mark.parametrize(
    ("kwargs", "nearest"),
    [({"reductions": ["meen"]}, "mean"), ({"abs_reductions": ["maxx"]}, "max"), ({"norms": ["l2x"]}, "l2")],
)
def test_a_misspelt_reduction_names_the_nearest(kwargs, nearest):
    from smdebug.exceptions import ConfigError

    with pytest.raises(ConfigError, match=f"did you mean '{nearest}'"):
        smdebug.ReductionConfig(**kwargs)


def test_every_error_of_the_library_crosses_a_process_with_its_message():
    """Errors travel pickled from a Dask worker (rules over many runs): each comes back as itself."""
    import inspect
    import pickle

    import smdebug.exceptions as errors

    classes = [
        c
        for c in vars(errors).values()
        if inspect.isclass(c) and issubclass(c, BaseException) and c.__module__ == errors.__name__
    ]
    assert len(classes) > 10
    for cls in classes:
        params = [p for name, p in inspect.signature(cls.__init__).parameters.items() if name != "self"]
        required = [p for p in params if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        error = cls(*[f"arg{i}" for i in range(len(required) or 1)])  # (a message, for *args)
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is cls and str(again) == str(error), cls.__name__
