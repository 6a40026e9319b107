"""The analysis subcommands (ls, show, plot, export-tensorboard), each run as a real subprocess."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import EVAL_STEPS, SAVE_INTERVAL, TRAIN_STEPS
from support import one_line_error

LOSS = "CrossEntropyLoss_output_0"


def test_subcommands_are_registered(cli):
    result = cli("--help")
    assert result.returncode == 0
    for name in ("ls", "show", "plot", "export-tensorboard"):
        assert name in result.stdout


def test_ls_lists_steps_modes_workers_collections_tensors(cli, run_dir, trial):
    result = cli("ls", run_dir)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "training ended" in out
    assert "worker_0" in out
    assert "TRAIN" in out and "EVAL" in out
    for coll in ("gradients", "losses", "weights", "biases"):
        assert coll in out
    for name in trial.tensor_names():
        assert name in out
    bias = trial.tensor_names(collection="biases")[0]
    (bias_line,) = [line for line in out.splitlines() if line.split() and line.split()[0] == bias]
    assert "abs_max" in bias_line and "l2" in bias_line and "value" not in bias_line


def test_ls_json(cli, run_dir, trial):
    result = cli("ls", run_dir, "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["workers"] == ["worker_0"]
    assert info["steps"] == trial.steps()
    assert info["modes"]["TRAIN"]["mode_steps"] == list(range(TRAIN_STEPS))  # save_scalar saves every step
    assert info["modes"]["EVAL"]["mode_steps"] == list(range(0, EVAL_STEPS, SAVE_INTERVAL))
    assert info["collections"]["gradients"] == len(trial.tensor_names(collection="gradients"))
    tensors = {t["name"]: t for t in info["tensors"]}
    assert set(tensors) == set(trial.tensor_names())
    weight = trial.tensor_names(collection="weights")[0]
    assert tensors[weight]["shape"] == list(trial.tensor(weight).value(0).shape)
    assert tensors[LOSS]["steps"] == len(trial.tensor(LOSS).steps())


def test_ls_filters_by_collection(cli, run_dir, trial):
    info = json.loads(cli("ls", run_dir, "--json", "--collection", "gradients").stdout)
    assert [t["name"] for t in info["tensors"]] == trial.tensor_names(collection="gradients")


def test_show_lists_every_saved_step(cli, run_dir, trial):
    result = cli("show", run_dir, LOSS)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == trial.tensor(LOSS).steps()
    assert [r[1] for r in rows] == [trial.mode(s).name for s in trial.tensor(LOSS).steps()]
    for row in rows:
        assert float(row[5]) == pytest.approx(float(trial.tensor(LOSS).value(int(row[0]))), rel=1e-5)


def test_show_one_step_of_one_mode_prints_the_value(cli, run_dir, trial):
    grad = trial.tensor_names(collection="gradients")[0]
    result = cli("show", run_dir, grad, "--step", "2", "--mode", "train", "--full")
    assert result.returncode == 0, result.stderr
    value = trial.tensor(grad).value(2, mode="TRAIN")
    assert f"shape: {value.shape}" in result.stdout
    printed = result.stdout.split("dtype: float32", 1)[1]
    numbers = np.array([float(x) for x in printed.replace("[", " ").replace("]", " ").split()])
    np.testing.assert_allclose(numbers, value.reshape(-1), rtol=1e-6)


def test_show_prints_a_matrix_with_its_rows_aligned(cli, run_dir, trial):
    weight = next(n for n in trial.tensor_names(collection="weights") if trial.tensor(n).value(0).ndim == 2)
    result = cli("show", run_dir, weight, "--step", "0", "--full")
    assert result.returncode == 0, result.stderr
    printed = result.stdout.split("dtype: float32\n", 1)[1].rstrip("\n").splitlines()
    with np.printoptions(threshold=np.inf, floatmode="unique"):
        rows = np.array2string(trial.tensor(weight).value(0)).splitlines()
    assert printed == ["  " + row for row in rows]  # indented as the lines above it, rows aligned


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ("ls", "{run}", "--collection", "weigths"),
            ["'weigths' is not in the run; did you mean 'weights'?"],
        ),
        (
            ("show", "{run}", LOSS, "--worker", "worker_O"),
            ["'worker_O' is not in the run; did you mean 'worker_0'?"],
        ),
        (("diff", "{run}", "{run}", "--collection", "gradiants"), ["did you mean 'gradients'?"]),
    ],
)
def test_a_misspelt_collection_or_worker_names_the_nearest(cli, run_dir, args, fragments):
    one_line_error(cli(*(a.format(run=run_dir) for a in args)), *fragments)


def test_show_eval_mode_step(cli, run_dir, trial):
    result = cli("show", run_dir, LOSS, "--step", "0", "--mode", "EVAL")
    assert result.returncode == 0, result.stderr
    assert f"at step {TRAIN_STEPS} (EVAL step 0" in result.stdout
    printed = float(result.stdout.split("dtype: float32", 1)[1])  # the value as printed, to compare exactly
    np.testing.assert_allclose(printed, trial.tensor(LOSS).value(0, mode="EVAL"), rtol=1e-6)


def test_show_reductions_only_tensor(cli, run_dir, trial):
    bias = trial.tensor_names(collection="biases")[0]
    result = cli("show", run_dir, bias, "--step", "0")
    assert result.returncode == 0, result.stderr
    assert "only reductions" in result.stdout
    l2 = trial.tensor(bias).reduction_value(0, "l2")
    assert f"l2: {float(l2):.6g}" in result.stdout


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("show", "{run}", "nope"), ["tensor 'nope' was not saved"]),
        (("show", "{run}", "CrossEntropyLoss_output", "--step", "0"), ["did you mean", LOSS]),
        (("show", "{run}", LOSS, "--step", "1", "--mode", "EVAL"), ["not available"]),
        # a step the tensor was not saved at: its saved steps, the nearest first
        (
            ("show", "{run}", LOSS, "--step", "3"),
            [f"{LOSS} is not available at step 3; the nearest saved is 2; its steps: 0, 2, 4"],
        ),
        (("show", "{run}", LOSS, "--mode", "sideways"), ["invalid mode"]),
        (("ls", "{missing}"), ["no such file or directory"]),
        (("ls", "{empty}"), ["no smdebug run found"]),
        (("plot", "{run}", "zzz", "-o", "{png}"), ["no saved tensor matches 'zzz'"]),
        (("plot", "{run}", LOSS, "-o", "{png}", "--reduction", "median_of_means"), ["unknown reduction"]),
        (("export-tensorboard", "{run}", "{logs}", "--worker", "worker_9"), ["worker 'worker_9'"]),
        (("ls", "{run}", "--regex", "fc1("), ["invalid regex", "missing )"]),
        (
            ("ls", "{run}", "--collection", "gradient"),
            ["collection 'gradient' is not in the run", "gradients"],
        ),
        (("plot", "{run}", LOSS, "-o", "{png}", "--mode", "PREDICT"), [f"saved for {LOSS} in mode PREDICT"]),
        (("ls", "{run}", "--collection", "weights", "--regex", "[fc"), ["invalid regex"]),
    ],
)
def test_errors_are_one_clear_line(cli, run_dir, tmp_path, args, fragments):
    (tmp_path / "empty").mkdir()
    paths = {
        "run": run_dir,
        "missing": tmp_path / "missing",
        "empty": tmp_path / "empty",
        "png": tmp_path / "x.png",
        "logs": tmp_path / "logs",
    }
    result = cli(*(a.format(**paths) for a in args))
    one_line_error(result, *fragments)
    assert not (tmp_path / "x.png").exists()


def test_plot_writes_a_png_with_the_series(cli, run_dir, trial, png, tmp_path):
    out = tmp_path / "plot.png"
    result = cli("plot", run_dir, LOSS, "gradient/", "-o", out, "--log", "--separate")
    assert result.returncode == 0, result.stderr
    width, height = png(out)
    assert width >= 600 and height >= 600  # two panels
    lines = result.stdout.splitlines()
    assert f"{LOSS} [TRAIN]: {len(trial.tensor(LOSS).steps(mode='TRAIN'))} points" in result.stdout
    assert f"{LOSS} [EVAL]: {len(trial.tensor(LOSS).steps(mode='EVAL'))} points" in result.stdout
    for grad in trial.tensor_names(collection="gradients"):
        assert any(f"panel 2: l2({grad}) [TRAIN]" in line for line in lines)


def test_plot_with_reduction_and_mode(cli, run_dir, trial, png, tmp_path):
    out = tmp_path / "plot.png"
    bias = trial.tensor_names(collection="biases")[0]
    result = cli("plot", run_dir, bias, "-o", out, "--reduction", "abs_max", "--mode", "TRAIN")
    assert result.returncode == 0, result.stderr
    png(out)
    assert f"abs_max({bias}) [TRAIN]: {len(trial.tensor(bias).steps(mode='TRAIN'))} points" in result.stdout


def test_plot_without_matplotlib_says_what_to_install(cli, run_dir, tmp_path):
    blocker = tmp_path / "block"
    (blocker / "matplotlib").mkdir(parents=True)
    (blocker / "matplotlib" / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    result = cli("plot", run_dir, LOSS, "-o", tmp_path / "x.png", env={"PYTHONPATH": str(blocker)})
    one_line_error(result, "pip install matplotlib")


def test_export_tensorboard_command(cli, run_dir, tb, tmp_path):
    logs = tmp_path / "logs"
    result = cli("export-tensorboard", run_dir, logs)
    assert result.returncode == 0, result.stderr
    assert "tensorboard --logdir" in result.stdout
    assert sorted(p.name for p in logs.iterdir()) == ["EVAL", "TRAIN"]
    read = tb(logs / "TRAIN")
    live = tb(Path(run_dir) / "tensorboard" / "TRAIN")
    assert read["scalars"][LOSS] == live["scalars"][LOSS]
    # biases are saved as reductions only: their histograms are in the hook's live export alone
    assert set(read["histograms"]) == {t for t in live["histograms"] if not t.startswith("biases/")} != set()


def test_a_reader_that_stops_early_gets_no_error(run_dir):
    # `smdebug ls RUN | head -1`: the pipe is closed before ls writes (it is still starting)
    exe = shutil.which("smdebug", path=os.path.dirname(sys.executable)) or "smdebug"
    proc = subprocess.Popen([exe, "ls", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert b"Broken pipe" not in err and b"Traceback" not in err, err
    assert proc.returncode in (0, 141)
