"""Both directions against the real smdebug 1.0.34, run in its own venv (``SMDEBUG_1034_PYTHON``).

Every scenario of ``compat_scenarios`` is written twice, by our plugin (in this process) and by smdebug
1.0.34 (in a subprocess of its venv); then each library reads both runs. We check that smdebug sees our
runs exactly as it sees its own and as we see them, that we see smdebug's runs exactly as smdebug does,
and that both libraries write the same files: event records byte for byte (but for wall times), the
same index entries and collections.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import compat_scenarios
import pytest

import smdebug.pytorch as smd
from smdebug import codec
from smdebug.trials import create_trial

HERE = Path(__file__).parent
DRIVER = HERE / "smdebug_driver.py"
TESTS_TORCH = HERE.parent / "torch"
SCENARIOS = sorted(compat_scenarios.SCENARIOS)
# smdebug 1.0.34's PyTorch hook stores torch's std/var (unbiased) while its own reader, like ours,
# computes numpy's (ddof=0); we store numpy's, so only these stored values differ between writers.
WRITER_SPECIFIC_REDUCTIONS = {"std", "variance", "abs_std", "abs_variance"}
# A scalar saved between the last TRAIN step and the first EVAL step goes into the TRAIN step in both
# libraries' index files; smdebug 1.0.34 stamps its event with the mode about to start and mode step -1,
# ours with the step's own (TRAIN, 2). Only these records' mode fields differ.
STAMPED_WITH_THE_NEXT_MODE = {"scalars_outside_steps": {"scalar/epoch_accuracy"}}
# Our regexes for module tensors and losses are anchored (``^act_input_\d+$`` where smdebug has
# ``act_input_``), so the regex lists differ between writers; the tensors each collection holds do not.


@pytest.fixture(scope="session")
def smdebug_python():
    python = os.environ.get("SMDEBUG_1034_PYTHON")
    if not python or not os.path.exists(python):
        pytest.fail(
            "SMDEBUG_1034_PYTHON must name the python of a venv with smdebug 1.0.34: run `nox -s compat`"
        )
    return python


def _run(python, *args):
    done = subprocess.run([python, *map(str, args)], capture_output=True, text=True, timeout=300)
    if done.returncode:
        pytest.fail(f"{python} {' '.join(map(str, args))} failed:\n{done.stderr[-4000:]}")
    return done


@pytest.fixture(scope="session")
def seen(tmp_path_factory, smdebug_python):
    """{("ours" | "theirs", scenario): {"smdebug": what smdebug reads, "us": what we read, "path": run}}."""
    root = tmp_path_factory.mktemp("compat")
    compat_scenarios.write_runs(smd, str(root / "ours"))
    _run(smdebug_python, DRIVER, "write", root / "theirs")
    runs = {(writer, s): str(root / writer / s) for writer in ("ours", "theirs") for s in SCENARIOS}
    _run(smdebug_python, DRIVER, "read", root / "seen.json", *runs.values())
    with open(root / "seen.json") as f:
        by_smdebug = json.load(f)
    return {
        key: {
            "path": path,
            "smdebug": by_smdebug[path],
            "us": json.loads(json.dumps(compat_scenarios.describe(create_trial, smd.modes, path))),
        }
        for key, path in runs.items()
    }


def _differences(a, b, path="", limit=12):
    """Where two JSON values differ, as short readable lines."""
    out = []

    def walk(x, y, where):
        if len(out) >= limit:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                if k not in x or k not in y:
                    side = "second" if k not in x else "first"
                    out.append(f"{where}/{k}: only in the {side}")
                else:
                    walk(x[k], y[k], f"{where}/{k}")
        elif x != y:
            out.append(f"{where}: {str(x)[:200]} != {str(y)[:200]}")

    walk(a, b, path)
    return out


def _assert_same(a, b, what):
    diff = _differences(a, b)
    assert not diff, what + ":\n" + "\n".join(diff)


def _writer_neutral(view):
    """What must not depend on which library wrote the run."""
    view = json.loads(json.dumps(view))
    for tensor in view["tensors"].values():
        for entry in tensor["values"].values():
            for name in WRITER_SPECIFIC_REDUCTIONS:
                entry["reductions"].pop(name, None)
    for coll in view["collections"].values():
        coll.pop("include_regex")
    return view


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_smdebug_reads_our_run_as_its_own(seen, scenario):
    ours, theirs = seen["ours", scenario]["smdebug"], seen["theirs", scenario]["smdebug"]
    assert ours["tensor_names"], "the scenario saved nothing"
    _assert_same(
        _writer_neutral(ours),
        _writer_neutral(theirs),
        "smdebug 1.0.34 reads our run (first) differently from its own (second)",
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_smdebug_reads_our_run_as_we_do(seen, scenario):
    run = seen["ours", scenario]
    _assert_same(run["smdebug"], run["us"], "our run as read by smdebug 1.0.34 (first) and by us (second)")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_we_read_smdebug_run_as_smdebug_does(seen, scenario):
    run = seen["theirs", scenario]
    _assert_same(
        run["us"], run["smdebug"], "smdebug 1.0.34's run as read by us (first) and by smdebug (second)"
    )


def _files(root):
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file())


def _index_view(path):
    with open(path) as f:
        index = json.load(f)
    return {
        "meta": index["meta"],
        "tensors": sorted(t["tensorname"] for t in index["tensor_payload"]),
        "shapes": sorted((s["tensorname"], s["shape"]) for s in index.get("shape_payload", [])),
    }


def _records(path):
    """{tensor name: its whole TFRecord, wall time zeroed} of an event file."""
    with open(path, "rb") as f:
        data = f.read()
    out = {}
    for offset, payload in codec.iter_records(data):
        record = bytearray(data[offset : offset + len(payload) + 16])
        assert payload[0] == 0x09  # Event.wall_time comes first: a double, 8 bytes after its key
        record[13:21] = bytes(8)
        tag = codec.decode_event(payload).values[0].tag
        if tag.split("/")[:3] not in [["smdebug", "reductions", r] for r in WRITER_SPECIFIC_REDUCTIONS]:
            out[tag] = record.hex()
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_same_files_events_index_and_collections(seen, scenario):
    ours, theirs = seen["ours", scenario]["path"], seen["theirs", scenario]["path"]
    assert _files(ours) == _files(theirs)
    for rel in _files(ours):
        if rel.startswith("events/"):  # byte for byte, but for wall times
            mine, reference = _records(f"{ours}/{rel}"), _records(f"{theirs}/{rel}")
            for tag in STAMPED_WITH_THE_NEXT_MODE.get(scenario, ()) & mine.keys() & reference.keys():
                del mine[tag], reference[tag]
            _assert_same(mine, reference, rel)
        elif rel.startswith("index/"):
            _assert_same(_index_view(f"{ours}/{rel}"), _index_view(f"{theirs}/{rel}"), rel)
        elif rel.startswith("collections/"):
            with open(f"{ours}/{rel}") as a, open(f"{theirs}/{rel}") as b:
                mine, reference = json.load(a), json.load(b)
            both = set(mine["collections"]) & set(reference["collections"])
            for coll, ref in ((mine["collections"][n], reference["collections"][n]) for n in both):
                coll.pop("include_regex"), ref.pop("include_regex")
                # smdebug leaves a mode its SaveConfig did not name null; we give it the defaults
                for mode in [m for m, config in (ref["save_config"] or {}).items() if config is None]:
                    coll["save_config"].pop(mode, None), ref["save_config"].pop(mode)
            _assert_same(mine, reference, rel)


def test_golden_names_file_is_current(smdebug_python, tmp_path):
    """tests/torch's golden names are still what smdebug 1.0.34 saves for its scenarios."""
    out = tmp_path / "names.json"
    _run(smdebug_python, TESTS_TORCH / "scenarios.py", out)
    with open(out) as f, open(TESTS_TORCH / "data" / "smdebug_1_0_34_names.json") as g:
        _assert_same(json.load(f), json.load(g), "smdebug 1.0.34 now (first) and the golden file (second)")


# -- resume after preemption: the checkpoint folder's state file, both ways --------------------------------
RESUME_SCRIPT = TESTS_TORCH / "resume_train.py"  # smdebug 1.0's API only


@pytest.mark.parametrize("first, then", [("ours", "smdebug"), ("smdebug", "ours")])
def test_a_job_restarted_with_the_other_library_resumes_from_its_state(
    first, then, smdebug_python, preemption, tmp_path
):
    """A job checkpoints after step 4 and ends; the job restarted from that checkpoint, with the other
    library and a new out_dir, numbers its steps on from step 5, and records its own checkpoint beside."""
    python = {"ours": None, "smdebug": smdebug_python}
    preemption.run(RESUME_SCRIPT, 1, 8, checkpoint_at=4, python=python[first])
    later = str(tmp_path / "later")
    preemption.run(RESUME_SCRIPT, 2, 9, checkpoint_at=6, python=python[then], out_dir=later)
    trial = create_trial(later)
    assert trial.steps() == [5, 6, 7, 8]
    assert [int(trial.tensor("scalar/run").value(s).item()) for s in trial.steps()] == [2, 2, 2, 2]
    states = json.loads((preemption.folder / "metadata.json").read_text())
    # (smdebug 1.0 compares the files' sizes only: it misses a checkpoint rewritten at the same size)
    expected = [(0, 4), (1, 6)] if then == "ours" else [(0, 4)]
    assert [(s["training-run"], s["latest-global-step-seen"]) for s in states] == expected
    assert all(s["latest-mode-step"]["TRAIN"] == s["latest-global-step-seen"] for s in states)


def test_smdebug_reads_the_health_recorder(smdebug_python, tmp_path):
    """A health=True run whose recorder was written by a planted NaN gradient: smdebug 1.0.34 reads the
    recorded steps' l2 and max |x| as we do, and is not confused by the health record."""
    import torch
    from torch import nn

    out = str(tmp_path / "health")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = smd.Hook(out_dir=out, health=True, save_config=smd.SaveConfig(save_interval=100))
    hook.register_module(model)
    hook.register_loss(criterion)
    for step in range(6):
        opt.zero_grad()
        criterion(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
        if step == 4:
            model[2].bias.grad[0] = float("nan")
        opt.step()
    hook.close()
    trial = create_trial(out)
    assert trial.first_nonfinite()["tensor"] == "gradient/Sequential_2.bias"
    names = ["Sequential_0.weight", "gradient/Sequential_2.bias", "CrossEntropyLoss_output_0"]
    ours = {
        n: {
            str(s): [
                float(trial.tensor(n).reduction_value(s, "l2")),
                float(trial.tensor(n).reduction_value(s, "max", abs=True)),
            ]
            for s in (1, 2, 3)
        }
        for n in names
    }
    code = (
        "import json, sys\n"
        "from smdebug.trials import create_trial\n"
        "t = create_trial(sys.argv[1])\n"
        "names = json.loads(sys.argv[2])\n"
        "print(json.dumps({'steps': t.steps(), 'values': {n: {str(s): [float(t.tensor(n).reduction_value(s, 'l2')), "
        "float(t.tensor(n).reduction_value(s, 'max', abs=True))] for s in (1, 2, 3)} for n in names}}))\n"
    )
    theirs = json.loads(
        _run(smdebug_python, "-c", code, out, json.dumps(names)).stdout.strip().splitlines()[-1]
    )
    assert theirs["steps"] == [0, 1, 2, 3, 4]
    assert theirs["values"] == ours


def test_smdebug_ignores_the_rule_firings_record(smdebug_python, tmp_path):
    """A run whose in-training rule fired (action None) holds rules/worker_0.json: smdebug 1.0.34 reads
    its steps and tensors as before."""
    import torch
    from torch import nn

    out = str(tmp_path / "fired")
    torch.manual_seed(0)
    model, criterion = nn.Linear(4, 3), nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    hook.register_module(model)
    hook.register_loss(criterion)
    hook.add_rule("loss_not_decreasing", action=None, num_steps="2")
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    for _ in range(5):
        criterion(model(x), y).backward()
    hook.close()
    assert [f["step"] for f in create_trial(out).rule_firings()] == [2, 4]
    code = (
        "import json, sys\n"
        "from smdebug.trials import create_trial\n"
        "t = create_trial(sys.argv[1])\n"
        "print(json.dumps({'steps': t.steps(), 'names': t.tensor_names()}))\n"
    )
    theirs = json.loads(_run(smdebug_python, "-c", code, out).stdout.strip().splitlines()[-1])
    assert theirs == {"steps": [0, 1, 2, 3, 4], "names": ["CrossEntropyLoss_output_0"]}


def test_smdebug_reads_a_run_with_the_median_reduction(smdebug_python, tmp_path):
    """The reference lists median, smdebug 1.0.34 does not: it reads such a run's other reductions as we
    do (it refused the whole run when the collections file named median), and we still read the medians."""
    import torch
    from torch import nn

    out = str(tmp_path / "median")
    torch.manual_seed(0)
    model, criterion = nn.Linear(4, 3), nn.CrossEntropyLoss()
    config = smd.ReductionConfig(reductions=["median", "max"], abs_reductions=["median"], norms=["l2"])
    hook = smd.Hook(
        out_dir=out,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights"],
        reduction_config=config,
    )
    hook.register_module(model)
    for _ in range(2):
        criterion(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
    hook.close()
    trial = create_trial(out)
    weight = trial.tensor("Linear_weight")
    read = trial.collection("weights").reduction_config
    assert (sorted(read.reductions), read.abs_reductions, read.norms) == (
        ["max", "median"],
        ["median"],
        ["l2"],
    )
    assert weight.reduction_value(1, "median", abs=True) > 0
    ours = [[float(weight.reduction_value(s, "max")), float(weight.reduction_value(s, "l2"))] for s in (0, 1)]
    code = (
        "import json, sys\n"
        "from smdebug.trials import create_trial\n"
        "t = create_trial(sys.argv[1])\n"
        "w = t.tensor('Linear_weight')\n"
        "print(json.dumps({'steps': t.steps(), 'reductions': t.collection('weights').reduction_config.reductions,"
        " 'values': [[float(w.reduction_value(s, 'max')), float(w.reduction_value(s, 'l2'))] for s in (0, 1)]}))\n"
    )
    theirs = json.loads(_run(smdebug_python, "-c", code, out).stdout.strip().splitlines()[-1])
    assert theirs == {"steps": [0, 1], "reductions": ["max"], "values": ours}


def test_invoke_rule_evaluates_and_ends_as_smdebug_does(smdebug_python, tmp_path):
    """A custom rule through invoke_rule (start_step, end_step, raise_eval_cond) on one run, by each
    library: the same steps reach invoke_at_step, and each call ends the same way (returns, or raises
    RuleEvaluationConditionMet at the same step, or NoMoreData at the end of the run)."""
    import rule_invocations
    import torch
    from torch import nn

    out = str(tmp_path / "run")
    torch.manual_seed(0)
    model, criterion = nn.Linear(4, 1), nn.MSELoss()
    hook = smd.Hook(
        out_dir=out, save_config=smd.SaveConfig(save_interval=2), include_collections=["gradients"]
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    for step in range(10):  # saved at 0, 2, ..., 8; inputs scaled up at step 4 make its gradients large
        x = torch.randn(8, 4) * (100 if step == 4 else 1)
        criterion(model(x), torch.zeros(8, 1)).backward()
    hook.close()
    for threshold in ("1.0", "1e9"):  # fires at step 4 / never
        done = _run(smdebug_python, HERE / "rule_invocations.py", out, threshold)
        theirs = json.loads(done.stdout.strip().splitlines()[-1])
        ours = [rule_invocations.outcome(out, threshold, **kwargs) for kwargs in rule_invocations.CALLS]
        assert ours == theirs, _differences(ours, theirs)
    # a rule declaring required tensors (req_tensors): the same steps, skipped when one is missing
    done = _run(smdebug_python, HERE / "rule_invocations.py", out, "required")
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert rule_invocations.required(out) == theirs, _differences(rule_invocations.required(out), theirs)
    assert [step for step, _ in theirs[2][1]] == []  # a tensor the run does not have: every step skipped
    assert [step for step, _ in theirs[3][1]] == [2, 4, 6, 8]  # step 0 needs step -2
    assert ours[0] == {
        "seen": [0, 2, 4, 6, 8],
        "ended": "NoMoreData",
        "step": 9,
        "last_step": 8,
        "str": ours[0]["str"],
    }
