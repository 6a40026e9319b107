"""A damaged or hostile run folder given to the reader or the CLI: huge numbers, deep JSON, FIFOs, devices
and links out of the run give one clean CorruptRunError naming the file when the run's own files are hit,
a skipped and reported step when a step's index file is, a skipped, reported value when a record is;
never a hang, a MemoryError or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import smdebug
from smdebug.exceptions import CorruptRunError, CorruptTensorRecord
from smdebug.hook import BaseHook
from smdebug.trials import create_trial

INDEX1 = os.path.join("index", "000000000", "000000000001_worker_0.json")
COLLECTIONS = os.path.join("collections", "000000000", "worker_0_collections.json")


@pytest.fixture
def run(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out, save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(3):
        hook.begin_step()
        hook.save_tensor("a", np.full((4,), step, dtype=np.float32))
    hook.close()
    return out


def edit_index(run, **changes):
    path = os.path.join(run, INDEX1)
    with open(path) as f:
        index = json.load(f)
    index["tensor_payload"][0].update(changes)
    with open(path, "w") as f:
        f.write(json.dumps(index).replace('"HUGE"', "1e999"))
    return path


def assert_step_skipped(run, problem: str) -> None:
    """Step 1's index file is damaged: the trial opens, leaves step 1 out, names the file and the
    problem; the other steps read; `smdebug ls` says so."""
    trial = create_trial(run)
    assert trial.steps() == [0, 2] and trial.tensor("a").steps() == [0, 2]
    assert trial.corrupt_steps() == [1]
    why = trial.corrupt()["worker_0"][1]
    assert "000000000001_worker_0.json" in why and problem in why, why
    assert trial.tensor("a").value(2)[0] == 2
    listed = cli("ls", run)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert "1 step(s) DAMAGED" in listed.stdout and "000000000001_worker_0.json" in listed.stdout


def cli(*args, timeout=60):
    """`smdebug ARGS` in a subprocess (a hang fails the test instead of hanging it)."""
    return subprocess.run(
        [sys.executable, "-m", "smdebug", *args], capture_output=True, text=True, timeout=timeout
    )


def in_subprocess(code: str, timeout=60):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_a_huge_length_is_not_allocated(run):
    edit_index(run, length=2**40)
    trial = create_trial(run)
    try:  # the record's own framing may still hold: read no more than the file has
        assert trial.tensor("a").value(1)[0] == 1
    except CorruptTensorRecord as exc:
        assert "000000000001_worker_0.tfevents" in str(exc)
    assert trial.tensor("a").value(2)[0] == 2  # the other steps still read
    shown = cli("show", run, "a")
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr


@pytest.mark.parametrize("start", [2**64, -5, "HUGE"])
def test_an_offset_out_of_range_skips_its_step(run, start):
    edit_index(run, start_idx=start)
    assert_step_skipped(run, "malformed index file")


def test_an_infinite_unsaved_step_is_skipped_not_an_overflow(run, caplog):
    os.makedirs(os.path.join(run, "unsaved_steps"), exist_ok=True)
    with open(os.path.join(run, "unsaved_steps", "worker_0.json"), "w") as f:
        f.write('{"worker": "worker_0", "unsaved_steps": [{"step": 1e999, "reason": "x"}]}')
    trial = create_trial(run)
    assert trial.unsaved() == {}
    assert "worker_0.json is not readable" in caplog.text
    listed = cli("ls", run)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr


def test_a_damaged_unsaved_steps_record_is_warned_of_once(run, caplog):
    """Reading both trial.unsaved_steps and trial.unsaved() warned twice of the same damaged file."""
    os.makedirs(os.path.join(run, "unsaved_steps"), exist_ok=True)
    with open(os.path.join(run, "unsaved_steps", "worker_0.json"), "w") as f:
        f.write('{"worker": "worker_0", "unsaved_st')
    trial = create_trial(run)
    assert trial.unsaved_steps == [] and trial.unsaved() == {} and trial.unsaved_steps == []
    warned = [r.getMessage() for r in caplog.records if "is not readable" in r.getMessage()]
    assert len(warned) == 1 and "unsaved_steps/worker_0.json" in warned[0], warned


@pytest.mark.parametrize("which", [INDEX1, COLLECTIONS])
def test_deeply_nested_json_names_the_file(run, which):
    with open(os.path.join(run, which), "w") as f:
        f.write("[" * (50 * 1024 * 1024))
    if which == INDEX1:  # a step's file: that step is skipped
        assert_step_skipped(run, "nested too deeply")
        return
    with pytest.raises(CorruptRunError, match=os.path.basename(which)) as info:
        create_trial(run)
    assert "nested too deeply" in str(info.value)


@pytest.mark.parametrize(
    "which", [INDEX1, os.path.join("events", "000000000001", "000000000001_worker_0.tfevents")]
)
def test_a_fifo_never_hangs_the_reader_or_the_cli(run, which):
    path = os.path.join(run, which)
    os.unlink(path)
    os.mkfifo(path)
    code = (
        "from smdebug.trials import create_trial\n"
        "from smdebug.exceptions import CorruptRunError, StepUnavailable, TensorUnavailableForStep\n"
        f"try:\n    t = create_trial({run!r}); print(t.corrupt()); t.tensor('a').value(1)\n"
        "except (CorruptRunError, StepUnavailable, TensorUnavailableForStep) as e:\n    print('clean:', e)\n"
    )
    read = in_subprocess(code, timeout=30)
    assert "clean:" in read.stdout and "not a regular file" in read.stdout, read.stderr
    for args in (["ls", run], ["show", run, "a"]):
        out = cli(*args, timeout=30)
        assert "Traceback" not in out.stderr, out.stderr


def test_an_index_linked_to_a_device_is_not_read(run):
    path = os.path.join(run, INDEX1)
    os.unlink(path)
    os.symlink("/dev/zero", path)
    read = in_subprocess(
        f"from smdebug.trials import create_trial\nprint('damaged:', create_trial({run!r}).corrupt())\n",
        timeout=30,
    )
    assert "damaged:" in read.stdout and "000000000001_worker_0.json" in read.stdout, read.stderr
    assert "not read" in read.stdout


def test_links_out_of_the_run_are_not_followed(run, tmp_path):
    outside = tmp_path / "outside.json"
    path = os.path.join(run, INDEX1)
    os.replace(path, outside)
    os.symlink(outside, path)
    assert_step_skipped(run, "leading out of the run")
    # a folder of the run linked elsewhere: its files are not read either
    os.unlink(path)
    elsewhere = tmp_path / "elsewhere"
    os.replace(os.path.join(run, "events", "000000000002"), elsewhere)
    os.symlink(elsewhere, os.path.join(run, "events", "000000000002"))
    with pytest.raises(CorruptTensorRecord, match="leads out of the run"):
        create_trial(run).tensor("a").value(2)


@pytest.mark.parametrize(
    "linked, unsaved",
    [
        ("events/000000000000", [0]),  # a step's folder: that step is not written through it
        ("events", [0, 1]),  # the folder of every step's folder: no step's folder is made through it
    ],
)
def test_the_writer_does_not_write_through_a_linked_folder(tmp_path, linked, unsaved):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / linked).parent.mkdir(parents=True)
    os.symlink(elsewhere, out / linked)
    hook = BaseHook(out_dir=str(out), save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(2):
        hook.begin_step()
        hook.save_tensor("a", np.full((4,), step, dtype=np.float32))
    hook.close()
    assert list(elsewhere.iterdir()) == []
    trial = create_trial(str(out))
    assert trial.unsaved_steps == unsaved
    if 1 not in unsaved:
        assert trial.tensor("a").value(1)[0] == 1


@pytest.mark.parametrize(
    "signal", ['{"step": null}', '{"step": "x", "rule": 3}', '{"step": 1e999}', "[1]", "{"]
)
def test_a_bad_stop_signal_never_raises_in_the_training_thread(tmp_path, signal):
    from smdebug.exceptions import StopTraining
    from smdebug.stop_signal import STOP_SIGNAL_FILE

    out = tmp_path / "run"
    hook = BaseHook(out_dir=str(out), save_config=smdebug.SaveConfig(save_interval=1000))
    hook.begin_step()
    (out / STOP_SIGNAL_FILE).write_text(signal)
    for _ in range(3):  # steps that save nothing; the signal is looked for at most every 50 ms
        time.sleep(0.06)
        hook.begin_step()
    with pytest.raises(StopTraining) as info:  # the file's presence asks for the stop
        hook.raise_if_stop_requested()
    assert info.value.step == -1 and info.value.source == "signal"
    hook.close()


def test_ls_escapes_control_characters_and_caps_column_widths(tmp_path, capsys):
    from smdebug.cli import main

    out = str(tmp_path / "run")
    long_name = "w" * 10_000
    names = ["evil\x1b[2J\x1b[31mred", "b\nforged  99  (1,)  value", long_name] + [f"t{i}" for i in range(50)]
    hook = BaseHook(out_dir=out, save_config=smdebug.SaveConfig(save_interval=1))
    hook.begin_step()
    for name in names:
        hook.save_tensor(name, np.zeros((1,), dtype=np.float32))
    hook.close()
    assert main(["ls", out]) == 0
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "\\x1b[31mred" in printed
    assert not any(line.startswith("forged") for line in printed.splitlines())
    assert "b\\nforged" in printed
    assert long_name in printed  # printed whole, once; no other row padded to it
    assert len(printed) < 10_000 + 53 * 200, len(printed)


def edit_meta(run, **changes):
    path = os.path.join(run, INDEX1)
    with open(path) as f:
        index = json.load(f)
    index.update(changes)
    with open(path, "w") as f:
        f.write(json.dumps(index))


@pytest.mark.parametrize(
    "changes, problem",
    [
        # a meta, an entry or a shape of the wrong JSON type raised AttributeError out of create_trial
        # ('list' object has no attribute 'get') and `smdebug ls` said "cannot read the run"
        ({"meta": [1]}, "meta is a JSON list"),
        ({"tensor_payload": [[1, 2]]}, "tensor_payload is a JSON list"),
        ({"shape_payload": ["x"]}, "shape_payload is a JSON str"),
        # an event file named outside the run made values() of the tensor raise ValueError ("refusing
        # unsafe path"), losing its good steps too; the step was not listed as damaged
        (
            {"meta": {"mode": "GLOBAL", "mode_step": 1, "event_file_name": "../../../etc/passwd"}},
            "not a file",
        ),
        ({"meta": {"mode": "GLOBAL", "mode_step": 1, "event_file_name": "/etc/passwd"}}, "not a file"),
        ({"meta": {"mode": "GLOBAL", "mode_step": 1, "event_file_name": "events/a\x00b"}}, "not a file"),
    ],
)
def test_an_index_of_the_wrong_shape_or_naming_a_file_out_of_the_run_skips_its_step(run, changes, problem):
    edit_meta(run, **changes)
    assert_step_skipped(run, problem)
    assert sorted(create_trial(run).tensor("a").values()) == [0, 2]


def test_an_index_folder_that_is_a_file_is_named(run, caplog):
    # index/000000000 replaced by a file: the run read as one with no steps, without a word
    import shutil

    folder = os.path.join(run, "index", "000000000")
    shutil.rmtree(folder)
    with open(folder, "w") as f:
        f.write("x")
    trial = create_trial(run)
    assert trial.steps() == []
    said = [r.getMessage() for r in caplog.records if "is not a folder" in r.getMessage()]
    assert len(said) == 1 and "index/000000000" in said[0] and "steps 0-999" in said[0], said
    listed = cli("ls", run)
    assert "Traceback" not in listed.stderr and "index/000000000 is not a folder" in listed.stderr
