"""``smdebug rules`` as a user runs it: a real subprocess."""

import json
import os
import subprocess
import sys
import time

import numpy_runs
import pytest


def smdebug_rules(*args):
    return subprocess.run(
        [sys.executable, "-m", "smdebug", "rules", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    bad, good = str(base / "bad"), str(base / "good")
    numpy_runs.vanishing_gradient(bad, bad=True)
    numpy_runs.vanishing_gradient(good, bad=False)
    return bad, good


def row(output, name):
    return next(line for line in output.splitlines() if f" {name} " in line)


def test_all_rules_on_a_run_with_a_defect(runs):
    done = smdebug_rules(runs[0])
    assert done.returncode == 1, done.stderr
    assert "FIRED" in row(done.stdout, "vanishing_gradient") and "DeepSigmoid_layers.0" in done.stdout
    assert "ok" in row(done.stdout, "exploding_tensor")
    assert "skipped" in row(done.stdout, "all_zero")  # needs parameters to run
    assert "0, 1, 2, 3" in row(done.stdout, "vanishing_gradient")


def test_chosen_rules_with_parameters_on_a_healthy_run(runs):
    done = smdebug_rules(
        runs[1], "--rule", "vanishing_gradient", "--param", "threshold=1e-9", "--rule", "ExplodingTensor"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok" in row(done.stdout, "vanishing_gradient") and "ok" in row(done.stdout, "exploding_tensor")
    assert "all_zero" not in done.stdout


def test_parameters_change_the_verdict(runs):
    done = smdebug_rules(runs[1], "--rule", "vanishing_gradient", "--param", "threshold=10")
    assert done.returncode == 1 and "FIRED" in done.stdout


def test_step_range(runs):
    done = smdebug_rules(runs[0], "--rule", "vanishing_gradient", "--start-step", "1", "--end-step", "3")
    assert done.returncode == 1 and "1, 2" in row(done.stdout, "vanishing_gradient")
    assert "0, 1" not in done.stdout


def test_an_fsspec_uri(runs):
    done = smdebug_rules(f"file://{runs[0]}", "--rule", "vanishing_gradient")
    assert done.returncode == 1 and "FIRED" in done.stdout, done.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["{missing}"], "no such file or directory"),
        (["{good}", "--rule", "vanishing_gradiant"], "unknown rule 'vanishing_gradiant'"),
        (
            ["{good}", "--rule", "vanishing_gradient", "--param", "threshold=abc"],
            "threshold='abc' is not a number",
        ),
        (["{good}", "--rule", "all_zero"], "give collection_names or tensor_regex"),
        (["{good}", "--rule", "dead_relu", "--param", "nope=1"], "unknown parameter nope='1'"),
        (["{good}", "--start-step", "4", "--end-step", "4"], "--end-step 4 leaves no step to evaluate"),
    ],
)
def test_errors_are_one_clear_line(runs, tmp_path, args, message):
    args = [a.format(good=runs[1], missing=str(tmp_path / "missing")) for a in args]
    done = smdebug_rules(*args)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert done.stderr.startswith("smdebug rules: error:") and message in done.stderr


def test_param_needs_a_rule(runs):
    done = smdebug_rules(runs[1], "--param", "threshold=1")
    assert done.returncode == 2 and "give --rule NAME before its parameters" in done.stderr


def test_a_folder_without_a_run(tmp_path):
    done = smdebug_rules(str(tmp_path))
    assert done.returncode == 2 and "no smdebug run found" in done.stderr


def test_rule_invoker_command_line_of_older_smdebug(runs):
    done = subprocess.run(
        [sys.executable, "-m", "smdebug.rules.rule_invoker", "--trial-dir", runs[0], "--rule-name"]
        + ["VanishingGradient", "--threshold", "0.001", "--end-step", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "fired at steps [0, 1, 2]" in done.stdout, done.stderr
    assert "RuntimeWarning" not in done.stderr


def test_any_fsspec_path_in_process(capsys):
    """The command reads through fsspec: here a memory:// run, written and read in this process."""
    from smdebug.cli import main

    numpy_runs.vanishing_gradient("memory://rules-cli/bad", bad=True)
    assert main(["rules", "memory://rules-cli/bad", "--rule", "vanishing_gradient"]) == 1
    assert "FIRED" in capsys.readouterr().out
    assert main(["rules", "memory://rules-cli/bad", "--rule", "exploding_tensor"]) == 0


def test_watch_waits_for_a_run_whose_writer_has_only_claimed_it(tmp_path):
    """The hook claims its out_dir (writers/<worker>.json) before it writes a step: a watcher that looks
    then waits for the run's steps, rather than taking the folder for one that holds runs."""
    run = tmp_path / "run"
    (run / "writers").mkdir(parents=True)
    (run / "writers" / "worker_0.json").write_text("{}")
    done = smdebug_rules(str(run), "--watch", "--timeout", "1")
    assert done.returncode == 2 and "no smdebug run appeared within 1s" in done.stderr, done.stderr


def test_several_runs_and_json_with_the_core_alone(runs):
    """The core installed alone (neither pandas nor Dask): several runs, and --json, still work."""
    code = (
        "import sys; sys.modules['pandas'] = sys.modules['distributed'] = None\n"
        "from smdebug.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    args = [sys.executable, "-c", code, "rules", *runs, "--rule", "vanishing_gradient"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr  # fired on the bad run
    assert "FIRED" in done.stdout and "1 fired in 1 runs" in done.stdout
    assert done.stderr.count("\n") == 1 and "Dask is not installed" in done.stderr  # the one hint
    done = subprocess.run([*args[:4], runs[1], "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)["results"]
    assert results and {r["status"] for r in results} <= {"ok", "no data", "skipped"}


WALKTHROUGH_RULE = """
from smdebug.rules.rule import Rule


class CustomGradientRule(Rule):
    def __init__(self, base_trial, other_trials, threshold=10.0):
        super().__init__(base_trial, other_trials)
        self.threshold = float(threshold)

    def invoke_at_step(self, step):
        for tname in self.base_trial.tensor_names(collection="gradients"):
            t = self.base_trial.tensor(tname)
            abs_mean = t.reduction_value(step, "mean", abs=True)
            if abs_mean > self.threshold:
                return True
        return False
"""


def test_a_custom_rule_from_its_source_file(runs, tmp_path):
    """The walkthrough's custom rule as SageMaker takes it (source file, rule_to_invoke, string
    rule_parameters): ``--rule FILE.py:CLASS --param k=v``, and the older rule_invoker command line."""
    source = tmp_path / "rules" / "my_custom_rule.py"
    source.parent.mkdir()
    source.write_text(WALKTHROUGH_RULE)
    spec = f"{source}:CustomGradientRule"
    done = smdebug_rules(runs[1], "--rule", spec, "--param", "threshold=1e-9")
    assert done.returncode == 1 and "FIRED" in done.stdout, done.stdout + done.stderr
    assert smdebug_rules(runs[1], "--rule", spec, "--param", "threshold=20.0").returncode == 0
    old = subprocess.run(
        [sys.executable, "-m", "smdebug.rules.rule_invoker", "--trial-dir", runs[1], "--rule-name", spec]
        + ["--threshold", "1e-9", "--end-step", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert old.returncode == 0 and "CustomGradientRule: fired at steps [0, 1]" in old.stdout, old.stderr
    # a wrong class or file, or a file that does not import: one line naming it
    for bad, message in [
        (f"{source}:Nope", "has no Rule subclass 'Nope' (it has: CustomGradientRule)"),
        (f"{tmp_path}/none.py:X", "none.py': no such file"),
    ]:
        done = smdebug_rules(runs[1], "--rule", bad)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    done = smdebug_rules(runs[1], "--rule", f"{broken}:R")
    assert done.returncode == 2 and "failed to import: ModuleNotFoundError" in done.stderr, done.stderr


def test_watch_gives_up_after_timeout_on_an_interrupted_run_with_every_rule(tmp_path):
    """An interrupted run (no end-of-job marker, no new step) with every built-in rule: stalled_training_rule
    waited for the next step up to its 1800 s threshold, so --timeout never applied."""
    run = tmp_path / "run"
    numpy_runs.vanishing_gradient(str(run), bad=False)
    os.remove(run / "training_job_end.ts")
    began = time.monotonic()
    done = smdebug_rules(str(run), "--watch", "--timeout", "2")
    assert time.monotonic() - began < 60, done.stdout
    assert "stopped watching: no new step for 2s" in done.stdout, done.stdout + done.stderr
    assert "stalled_training_rule" in done.stdout and "error" not in row(done.stdout, "stalled_training_rule")


def test_many_runs_with_an_interrupted_one_give_up_after_timeout_with_the_stall_rule(tmp_path):
    """Over several runs, a live (here interrupted) run is followed until no new step comes for --timeout:
    stalled_training_rule waited up to its 1800 s threshold instead."""
    for name in ("a", "b"):
        numpy_runs.vanishing_gradient(str(tmp_path / "sweep" / name), bad=False)
    os.remove(tmp_path / "sweep" / "a" / "training_job_end.ts")
    began = time.monotonic()
    done = smdebug_rules(
        str(tmp_path / "sweep"), "--rule", "stalled_training_rule", "--timeout", "2", "--json"
    )
    assert time.monotonic() - began < 60 and done.returncode == 0, done.stdout + done.stderr
    rows = {r["run"].rsplit("/", 1)[-1]: r for r in json.loads(done.stdout)["results"]}
    assert rows["a"]["note"] == "stopped following the run: no new step for 2s", rows
    assert rows["b"]["status"] == "ok" and not rows["a"]["error"]


@pytest.fixture(scope="module")
def no_gradients(tmp_path_factory):
    """A run that saved weights and losses only: the gradient rules have nothing to read."""
    out = str(tmp_path_factory.mktemp("nograd") / "run")
    hook = numpy_runs.make_hook(out, include=("weights", "losses"))
    numpy_runs.train(hook, lr=0.05, steps=4)
    hook.close()
    return out


def test_a_rule_with_nothing_to_read_says_so_not_ok(no_gradients):
    done = smdebug_rules(no_gradients)
    assert done.returncode == 0, done.stdout + done.stderr  # the run has no defect, only no gradients
    line = row(done.stdout, "vanishing_gradient")
    assert "no data" in line and "nothing to check" in line and " ok " not in line
    assert "ok" in row(done.stdout, "exploding_tensor")  # the weights and losses were checked


def test_a_rule_asked_for_with_nothing_to_read_is_not_a_pass(no_gradients):
    done = smdebug_rules(no_gradients, "--rule", "vanishing_gradient")
    assert done.returncode == 0, done.stdout + done.stderr  # it did not fire, nor fail
    assert "no data" in row(done.stdout, "vanishing_gradient") and " ok " not in done.stdout
    # a step range holding no step: nothing checked either
    done = smdebug_rules(no_gradients, "--rule", "exploding_tensor", "--start-step", "100")
    assert done.returncode == 0 and "no data" in row(done.stdout, "exploding_tensor")
    assert "no step" in row(done.stdout, "exploding_tensor")
    done = smdebug_rules(no_gradients, "--rule", "exploding_tensor")
    assert done.returncode == 0 and "ok" in row(done.stdout, "exploding_tensor")
