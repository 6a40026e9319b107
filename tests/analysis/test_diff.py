"""``smdebug diff`` and ``smdebug.trials.diff``: where two real runs part (two DDP ranks: tests/torch_dist)."""

import json

import numpy as np
import pytest
from conftest import Net, batch
from numpy_training import SGD, CrossEntropyLoss, NumpyHook, train_step

import smdebug
from smdebug import plugins

LOSS = "CrossEntropyLoss_output_0"


def train(out_dir, steps=16, change_at=None, lr=0.1, shift=0.5, eval_every=None):
    """Net on seeded data, every step saved; from step ``change_at`` on the data differs."""
    plugins.reset()
    model, loss_fn, opt = Net(), CrossEntropyLoss(), SGD(lr)
    hook = NumpyHook(
        out_dir=str(out_dir),
        save_config=smdebug.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses"],
    )
    hook.get_collection("biases").reduction_config = smdebug.ReductionConfig(norms=["l2"])
    data = np.random.default_rng(1)
    for step in range(steps):
        x, y = batch(data, 8)
        if change_at is not None and step >= change_at:
            x = x + np.float32(shift)
        if eval_every:
            hook.set_mode(smdebug.modes.TRAIN)
        train_step(hook, model, x, y, loss_fn, opt)
        if eval_every and step % eval_every == eval_every - 1:  # a validation batch: no update
            hook.set_mode(smdebug.modes.EVAL)
            train_step(hook, model, *batch(np.random.default_rng(step), 8), loss_fn)
    hook.close()
    plugins.reset()
    return str(out_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff")
    return {
        "a": train(root / "a"),
        "same": train(root / "same"),
        "changed": train(root / "changed", change_at=12),
    }


def test_two_same_seed_runs_agree(runs, cli):
    result = cli("diff", runs["a"], runs["same"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "agree" in result.stdout.splitlines()[0]
    from smdebug.trials import diff

    df = diff(runs["a"], runs["same"])
    assert set(df["status"]) == {"agrees"}
    assert LOSS in set(df["tensor"]) and "gradient/Net_fc1.weight" in set(df["tensor"])
    assert df.attrs["first"] is None
    # biases were saved as l2 norms only: compared as reductions
    assert df.set_index("tensor").loc["Net_fc1.bias", "compared"] == "l2"


def test_a_run_whose_data_changes_at_step_12_differs_first_at_step_12(runs, cli):
    result = cli("diff", runs["a"], runs["changed"])
    assert result.returncode == 1, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    assert "first differ at step 12," in first and first.endswith(f"tensor {LOSS}")
    assert LOSS in result.stdout and "gradient/Net_fc1.weight" in result.stdout

    data = json.loads(cli("diff", runs["a"], runs["changed"], "--json").stdout)
    assert data["differ"] is True and data["first"]["step"] == 12
    by_name = {t["tensor"]: t for t in data["tensors"]}
    assert by_name[LOSS]["step"] == 12 and by_name["gradient/Net_fc2.bias"]["step"] == 12
    # the weights saved at step 12 were taken before its update: they part one step later
    assert by_name["Net_fc1.weight"]["step"] == 13
    assert by_name["Net_fc1.bias"]["step"] == 13 and by_name["Net_fc1.bias"]["compared"] == "l2"

    from smdebug.trials import diff

    df = diff(runs["a"], runs["changed"])
    assert df.attrs["first"]["step"] == 12
    assert df.iloc[0]["step"] == 12 and df.iloc[0]["tensor"] == LOSS  # the first divergence first
    assert (df[df["status"] == "differs"]["step"] >= 12).all()
    # a tolerance wider than the change: they agree
    assert cli("diff", runs["a"], runs["changed"], "--regex", "^scalar|Loss", "--atol", "100").returncode == 0


def test_what_could_not_be_compared_is_said(runs, tmp_path, cli):
    short = train(tmp_path / "short", steps=6)
    result = cli("diff", runs["a"], short, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert all("steps saved by one side only: 10 in a, 0 in b" in t["not_compared"] for t in data["tensors"])


def test_diff_errors_are_one_line(runs, tmp_path, capsys):
    from smdebug.cli import main

    for args, fragment in [
        ((runs["a"],), "give two runs"),
        ((runs["a"], tmp_path / "missing"), "no such file or directory"),
        ((runs["a"], "--workers", "worker_0", "worker_9"), "worker 'worker_9'"),
        ((runs["a"], runs["same"], "--regex", "^nothing$"), "no tensors to compare"),
        ((runs["a"], runs["same"], "--rtol", "-1"), "rtol"),
    ]:
        assert main(["diff", *map(str, args)]) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("smdebug diff: error:") and fragment in lines[0], lines


def test_report_and_diff_read_any_fsspec_uri(tmp_path, capsys):
    """Both commands read through fsspec: memory:// runs, written and read in this process."""
    from smdebug.cli import main

    a, b = train("memory://report-diff/a", steps=4), train("memory://report-diff/b", steps=4, change_at=2)
    assert main(["diff", a, b]) == 1
    assert "first differ at step 2," in capsys.readouterr().out
    page = tmp_path / "memory.html"
    assert main(["report", a, "-o", str(page), "--no-rules"]) == 0
    assert LOSS in page.read_text() and "memory://report-diff/a" in page.read_text()


def test_nothing_comparable_says_why_and_json_still_prints(runs, tmp_path, cli):
    """Runs that share no tensor (another model) or no step: exit 2 with one line saying why, and --json
    prints the comparison that says it tensor by tensor."""
    other = tmp_path / "other"
    plugins.reset()
    hook = NumpyHook(out_dir=str(other), include_collections=["gradients"])
    hook.save_tensor("gradient/Other.weight", np.ones(3), collections_to_write="gradients")
    hook.close()
    plugins.reset()
    result = cli("diff", runs["a"], other)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "nothing both sides saved could be compared" in line
    assert "saved only in a" in line and "saved only in b" in line, line
    result = cli("diff", runs["a"], other, "--json")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    data = json.loads(result.stdout)
    assert data["differ"] is False and data["first"] is None
    assert {t["not_compared"] for t in data["tensors"]} == {"saved only in a", "saved only in b"}


def test_an_all_nan_tensor_is_summarised_without_numpy_warnings(runs, tmp_path, recwarn):
    """From step 12 the inputs are NaN: the divergence is there, and summarising an all-NaN gradient
    ("mean=nan") prints no "Mean of empty slice" RuntimeWarning into the command's output."""
    from smdebug.trials import diff

    nan_run = train(tmp_path / "nan", change_at=12, shift=np.nan)
    df = diff(runs["a"], nan_run)
    assert df.attrs["first"]["step"] == 12 and df.attrs["first"]["b"] == "nan"
    grad = df.set_index("tensor").loc["gradient/Net_fc1.weight"]
    assert grad["step"] == 12 and "mean=nan" in grad["b"]
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)], [
        str(w.message) for w in recwarn
    ]


class _TwoWorkers(NumpyHook):
    rank = 0

    def worker_name(self):
        return f"worker_{self.rank}"

    def num_workers(self):
        return 2


def _workers_run(out_dir, ranks, shift=None):
    """A run whose workers ``ranks`` each saved "x" = [0, 1, 2] * step at steps 0..2 (plus ``shift[rank]``
    from step 1 on) and "y" = -x."""
    plugins.reset()
    hooks = []
    for rank in ranks:
        hook = type(f"Rank{rank}", (_TwoWorkers,), {"rank": rank})(
            out_dir=str(out_dir), save_config=smdebug.SaveConfig(save_interval=1), include_workers="all"
        )
        hooks.append(hook)
    for step in range(3):
        for hook in hooks:
            hook.begin_step()
            x = np.arange(3.0) * step + (shift or {}).get(hook.rank, 0.0) * (step >= 1)
            hook.save_tensor("x", x)
            hook.save_tensor("y", -x)
            hook.end_step()
    for hook in hooks:
        hook.close()
    plugins.reset()
    return str(out_dir)


def test_a_worker_only_one_run_has_is_said_not_compared(tmp_path, cli):
    """A two-worker run against a one-worker run: worker_0 is compared with worker_0, and worker_1 (which
    the other run lacks) is said not compared, not passed over in silence."""
    from smdebug.trials import diff

    two, one = _workers_run(tmp_path / "two", [0, 1]), _workers_run(tmp_path / "one", [0])
    result = cli("diff", two, one)
    assert result.returncode == 0, result.stderr
    assert "worker_1" in result.stdout and "only in a" in result.stdout, result.stdout
    data = json.loads(cli("diff", two, one, "--json").stdout)
    assert any("worker_1" in note and "only in a" in note for note in data["notes"]), data
    df = diff(two, one)
    assert set(df["workers"]) == {"worker_0"} and any("worker_1" in n for n in df.attrs["notes"])


def test_runs_of_several_workers_name_the_worker_of_each_row_and_count_tensors(tmp_path, cli):
    """Two 2-worker runs: the table has a worker column (its rows looked duplicated), the first divergence
    names its worker, and the counts are of tensors (2), each on 2 worker pairs, not of their 4 pairs."""
    two = _workers_run(tmp_path / "two", [0, 1])
    same = _workers_run(tmp_path / "same", [0, 1])
    changed = _workers_run(tmp_path / "changed", [0, 1], shift={1: 0.5})
    result = cli("diff", two, same)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("2 tensor(s) compared, each on 2 worker pairs (worker_0, worker_1)"), lines
    assert lines[-1].startswith("2 tensor(s) agree"), lines

    result = cli("diff", two, changed, "--all")
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert "first differ at step 1" in lines[0] and lines[0].endswith("tensor x on worker_1"), lines
    header = next(line for line in lines if line.startswith("TENSOR"))
    assert header.split()[:3] == ["TENSOR", "WORKERS", "STATUS"], header
    rows = {tuple(line.split()[:3]) for line in lines[lines.index(header) + 1 :] if line.strip()}
    assert {("x", "worker_1", "differs"), ("x", "worker_0", "agrees"), ("y", "worker_0", "agrees")} <= rows
    # one pair of workers (--workers): as for one-worker runs, no worker column
    result = cli("diff", two, changed, "--workers", "worker_1", "worker_1")
    assert result.stdout.splitlines()[0].endswith("tensor x"), result.stdout
    assert "WORKERS" not in result.stdout


def test_help_texts_are_plain_text(cli):
    for command in ("diff", "report"):
        result = cli(command, "--help")
        assert result.returncode == 0 and f"usage: smdebug {command}" in result.stdout
        assert "``" not in result.stdout, result.stdout


def test_runs_with_a_different_eval_schedule_are_compared_step_for_step_by_mode(runs, tmp_path, cli):
    """The same training, one run validating every 5 steps: global step numbers no longer line up, so the
    runs are compared by mode step (TRAIN step 7 with TRAIN step 7): they agree, and a change of the data
    at TRAIN step 12 is found there (global step 14 of the run that validated twice before it)."""
    from smdebug.trials import diff

    with_eval = train(tmp_path / "eval", eval_every=5)
    plain = train(tmp_path / "plain", eval_every=None)
    result = cli("diff", plain, with_eval)
    assert result.returncode == 0, result.stdout
    df = diff(plain, with_eval)
    assert set(df["status"]) == {"agrees"}
    # the three validation steps: saved by one run only, and said so
    assert {n for n in df["not_compared"] if n} == {"steps saved by one side only: 0 in a, 3 in b"}
    changed = train(tmp_path / "changed_eval", eval_every=5, change_at=12)
    df = diff(changed, plain)
    first = df.attrs["first"]
    assert (first["step"], first["mode"], first["mode_step"]) == (14, "TRAIN", 12), first


def test_a_run_still_being_written_is_said_so(runs, tmp_path, cli):
    """A run without its end marker (training still running, or killed): the comparison covers the steps
    it has so far, and says that its later steps are not in it."""
    import shutil

    live = tmp_path / "live"
    shutil.copytree(runs["a"], live)
    (live / "training_job_end.ts").unlink()
    result = cli("diff", runs["same"], live)
    assert result.returncode == 0, result.stderr
    assert "b: training has not ended" in result.stdout, result.stdout
    data = json.loads(cli("diff", live, runs["same"], "--json").stdout)
    assert any(n.startswith("a: training has not ended") for n in data["notes"]), data["notes"]


def test_validation_phases_pair_by_the_training_step_they_follow(tmp_path):
    """One run validates every 5 training steps, the other every 10, on the same validation batches: each
    validation of the second pairs with the first's validation after the same training step (not with
    its first and second validations), so the two agree."""
    from smdebug.trials import diff

    often, rarely = train(tmp_path / "often", eval_every=5), train(tmp_path / "rarely", eval_every=10)
    df = diff(often, rarely).set_index("tensor")
    assert df.loc[LOSS, "status"] == "agrees", df.loc[LOSS].to_dict()
    assert df.loc[LOSS, "steps_compared"] == 16 + 1  # every training step and the one shared validation


def test_a_tolerance_that_is_not_a_number_is_a_clear_error(runs, capsys):
    """--atol nan silently dropped the tolerance (any difference at all 'differed'), --atol inf made any
    two runs 'agree': a tolerance must be a finite number >= 0, else one line (exit 2)."""
    from smdebug.cli import main
    from smdebug.exceptions import SMDebugValueError
    from smdebug.trials import diff

    for option in ("--rtol", "--atol"):
        for bad in ("nan", "inf"):
            assert main(["diff", runs["a"], runs["same"], option, bad]) == 2, (option, bad)
            (line,) = capsys.readouterr().err.strip().splitlines()
            assert option[2:] in line and bad in line, line
    with pytest.raises(SMDebugValueError, match="rtol"):
        diff(runs["a"], runs["same"], rtol=float("nan"))
