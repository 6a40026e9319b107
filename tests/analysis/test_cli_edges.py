"""The CLI's hard edges: an unreachable s3:// URI or no credentials, a damaged record in `smdebug show`, and
the messages of bad flags and bad configurations; the extras named when an optional package is missing."""

import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from support import one_line_error

from smdebug import layout

LOSS = "CrossEntropyLoss_output_0"


# -- item 13: unreachable S3 or no credentials ----------------------------------------------------------
@pytest.fixture(scope="module")
def dead_endpoint():
    """The address of moto's S3 server after it was stopped: nothing answers there any more."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    server.stop()
    return f"http://127.0.0.1:{port}"


def _aws_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_DEFAULT_REGION": "us-east-1", **extra})
    return env


@pytest.mark.parametrize("command", ["ls", "show", "rules"])
def test_unreachable_s3_is_one_line_exit_2_in_bounded_time(cli, dead_endpoint, command):
    uri = "s3://smdebug-gone/some/run"
    env = _aws_env(AWS_ENDPOINT_URL=dead_endpoint, AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s")
    args = [command, uri] + ([LOSS] if command == "show" else [])
    started = time.monotonic()
    result = cli(*args, env=env)
    elapsed = time.monotonic() - started
    line = one_line_error(result, uri)
    assert "connect" in line.lower(), line  # the cause, as the storage client words it
    assert elapsed < 30, elapsed


def test_no_credentials_is_one_line_exit_2(cli, dead_endpoint, tmp_path):
    uri = "s3://smdebug-nocreds/run"
    env = _aws_env(
        AWS_ENDPOINT_URL=dead_endpoint,
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",  # no instance metadata service on a test machine
    )
    started = time.monotonic()
    line = one_line_error(cli("ls", uri, env=env), uri)
    assert "credentials" in line.lower(), line
    assert time.monotonic() - started < 30


# -- item 16: a damaged record ------------------------------------------------------------------------------
def test_show_with_a_damaged_record_shows_the_other_steps_and_marks_it(cli, run_dir, trial, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    steps = trial.tensor(LOSS).steps()
    bad = steps[1]
    index = run / layout.index_file_path(bad, "worker_0")
    record = layout.decode_index(index.read_bytes())
    (start, length) = next((s, n) for name, s, n, _ in record.tensors if name == LOSS)
    event = run / record.event_file
    data = bytearray(event.read_bytes())
    data[start + length - 6] ^= 0xFF  # inside the payload: its CRC no longer matches
    event.write_bytes(bytes(data))

    result = cli("show", run, LOSS)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == steps  # every step is listed
    (damaged,) = [r for r in rows if "DAMAGED" in r]
    assert int(damaged[0]) == bad
    for row in rows:
        if row is not damaged:
            float(row[-1])  # the other steps show their value
    assert f"damaged record at step {bad}" in result.stderr
    assert "Traceback" not in result.stderr


# -- item 18: messages --------------------------------------------------------------------------------------
def test_smdebug_run_errors_start_with_the_subcommand(cli):
    result = cli("run")
    line = one_line_error(result, "give the command to run after --")
    assert line.startswith("smdebug run: error:"), line


def test_smdebug_run_config_errors_name_the_subcommand(cli, tmp_path):
    result = cli("run", "--config", tmp_path, "--", "python", "-c", "pass")
    line = one_line_error(result, str(tmp_path), "is a directory")
    assert line.startswith("smdebug run: error:"), line
    assert "does not exist" not in line


def test_collection_configurations_as_an_object_is_named(cli, tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"LocalPath": str(tmp_path / "o"), "CollectionConfigurations": {"a": 1}}))
    for extra in ([], ["--collections", "weights"]):
        result = cli("run", "--config", config, *extra, "--", "python", "-c", "pass")
        line = one_line_error(result, "CollectionConfigurations", "expected a list")
        assert "CollectionName" not in line.split("expected")[0], line


@pytest.mark.parametrize("command", ["ls", "show", "plot", "rules", "export-tensorboard", "run"])
def test_a_subcommands_bad_flag_prints_the_subcommands_usage(cli, run_dir, tmp_path, command):
    args = {
        "ls": [run_dir],
        "show": [run_dir, LOSS],
        "plot": [run_dir, LOSS, "-o", tmp_path / "x.png"],
        "rules": [run_dir],
        "export-tensorboard": [run_dir, tmp_path / "logs"],
        "run": [],
    }[command]
    tail = ["--", "python", "-c", "pass"] if command == "run" else []
    result = cli(command, *args, "--bogus", *tail)
    assert result.returncode == 2
    assert result.stderr.startswith(f"usage: smdebug {command}"), result.stderr
    assert f"smdebug {command}: error: unrecognized arguments: --bogus" in result.stderr
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    "args, suggestion",
    [
        (["sho", "RUN", LOSS], "did you mean 'show'?"),
        (["rules", "RUN", "--rule", "exploding_tensor", "--parm", "x=1"], "did you mean '--param'?"),
        (["ls", "RUN", "--jsn"], "did you mean '--json'?"),
        (["diff", "RUN", "RUN", "--rtl=1"], "did you mean '--rtol'?"),
    ],
)
def test_a_mistyped_flag_or_command_gets_a_suggestion(cli, run_dir, args, suggestion):
    result = cli(*(run_dir if a == "RUN" else a for a in args))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("smdebug") and ": error: " in last and last.endswith(suggestion), last


def test_a_flag_far_from_every_known_one_gets_no_suggestion(cli, run_dir):
    result = cli("ls", run_dir, "--zzzzzz")
    assert result.stderr.strip().splitlines()[-1] == "smdebug ls: error: unrecognized arguments: --zzzzzz"


def test_hook_configuration_path_that_is_a_directory(tmp_path, monkeypatch):
    from smdebug.exceptions import ConfigError
    from smdebug.json_config import CONFIG_FILE_PATH_ENV, find_config_path

    with pytest.raises(ConfigError, match="is a directory"):
        find_config_path(str(tmp_path))
    monkeypatch.setenv(CONFIG_FILE_PATH_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match=f"{CONFIG_FILE_PATH_ENV}: .* is a directory"):
        find_config_path()


# -- item 20: extras ----------------------------------------------------------------------------------------
def _blocked(tmp_path, *modules):
    blocker = tmp_path / "block"
    for module in modules:
        (blocker / module).mkdir(parents=True)
        (blocker / module / "__init__.py").write_text(f"raise ImportError('No module named {module}')\n")
    return {"PYTHONPATH": str(blocker)}


def test_missing_matplotlib_names_the_plot_extra(cli, run_dir, tmp_path):
    result = cli("plot", run_dir, LOSS, "-o", tmp_path / "x.png", env=_blocked(tmp_path, "matplotlib"))
    one_line_error(result, "pip install 'smdebug-core[plot]'")


def test_missing_s3fs_names_the_s3_extra(cli, tmp_path):
    result = cli("ls", "s3://bucket/run", env=_blocked(tmp_path, "s3fs"))
    one_line_error(result, "s3://bucket/run", "pip install 'smdebug-core[s3]'")


def test_missing_pandas_names_the_pandas_extra(tmp_path, run_dir):
    import subprocess
    import sys

    code = f"from smdebug.trials import to_dataframe; to_dataframe({str(run_dir)!r})"
    env = {**os.environ, **_blocked(tmp_path, "pandas")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode != 0
    assert "pip install 'smdebug-core[pandas]'" in result.stderr.strip().splitlines()[-1]


def test_dask_frames_without_dask_name_the_dask_extra(tmp_path, run_dir):
    import subprocess
    import sys

    code = f"from smdebug.trials import to_dataframe; to_dataframe({str(run_dir)!r}, dask=True)"
    env = {**os.environ, **_blocked(tmp_path, "dask")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode != 0
    assert "pip install 'smdebug-core[dask]'" in result.stderr.strip().splitlines()[-1]


def test_missing_tensorboard_names_the_tensorboard_extra(cli, run_dir, tmp_path):
    result = cli("export-tensorboard", run_dir, tmp_path / "logs", env=_blocked(tmp_path, "tensorboard"))
    assert result.returncode == 0, result.stderr
    assert "pip install 'smdebug-core[tensorboard]'" in result.stdout


def test_core_declares_the_extras():
    import tomllib

    project = tomllib.loads((Path(__file__).parents[2] / "core" / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert {"plot", "tensorboard", "s3", "pandas", "report"} <= set(extras)
    assert any(r.startswith("matplotlib") for r in extras["plot"])
    assert any(r.startswith("s3fs") for r in extras["s3"])


def test_smdebug_run_refuses_a_misspelt_localpath_it_would_otherwise_fill_in(cli, tmp_path):
    """`smdebug run --config` fills in a LocalPath when the file has none: a misspelt one must not pass."""
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"LocalPth": str(tmp_path / "run")}))
    result = cli("run", "--config", config, "--", "python", "-c", "pass", cwd=tmp_path)
    one_line_error(result, "LocalPth: unknown key", "did you mean 'LocalPath'?")
    assert not (tmp_path / "smdebug-runs").exists()


def test_why_on_a_damaged_health_record_says_so_once_instead_of_advising_health_true(cli, run_dir, tmp_path):
    """It said 'it holds no health record (train with health=True ...)', after warning twice."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "health").mkdir()
    (run / "health" / "worker_0.json").write_text('{"worker": "worker_0", "first_nonfin')
    result = cli("why", run)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "health=True" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "worker_0.json is not readable" in lines[0], result.stderr
    assert lines[1].startswith("smdebug why: error: the run's health record is damaged")
