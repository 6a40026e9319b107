"""Reading a run on S3 while the endpoint is down, and a run whose prefix holds glob characters.

A live Trial's queries (steps(), training_ended(), ...) raised botocore's EndpointConnectionError, no
OSError, during an outage; `smdebug rules --watch` died with its traceback; a run under ``exp[1]/run``
was written but could not be read (its index files were fetched as a glob)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ACCESS_KEY, SECRET_KEY

import smdebug
from smdebug.hook import BaseHook
from smdebug.layout import END_OF_JOB_FILE
from smdebug.store import Store, StoreUnavailableError
from smdebug.trials import create_trial


def write_run(uri: str, steps: int = 3) -> None:
    hook = BaseHook(out_dir=uri, save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(steps):
        hook.begin_step()
        hook.save_tensor("w", np.full((4,), step, dtype=np.float32))
        hook.save_scalar("loss", 1.0)
    hook.close()


def live_run(uri: str, steps: int = 3) -> bytes:
    """A run still being written (its end-of-job marker taken away); the marker's bytes."""
    write_run(uri, steps)
    store = Store(uri)
    marker = store.read_bytes(END_OF_JOB_FILE)
    store.remove(END_OF_JOB_FILE)
    return marker


def one_clear_line(error: BaseException, uri: str) -> str:
    text = str(error)
    assert isinstance(error, OSError), type(error)
    assert uri in text and "\n" not in text, text
    assert SECRET_KEY not in text and ACCESS_KEY not in text
    return text


def test_a_live_trial_during_an_outage_raises_oserrors_naming_the_store(s3_uri, s3_server):
    live_run(s3_uri)
    trial = create_trial(s3_uri)
    assert trial.steps() == [0, 1, 2] and not trial.training_ended()
    s3_server.stop()
    queries = {
        "steps": trial.steps,
        "training_ended": trial.training_ended,
        "tensor_names": trial.tensor_names,
        "has_passed_step": lambda: trial.has_passed_step(5),
        "wait_for_steps": lambda: trial.wait_for_steps([5], timeout=30),
    }
    for name, query in queries.items():
        with pytest.raises(OSError) as info:
            query()
        text = one_clear_line(info.value, s3_uri)
        assert isinstance(info.value, StoreUnavailableError) and "did not answer" in text, (name, text)
    s3_server.start()
    assert trial.steps() == [0, 1, 2]  # no damage: the same queries work once it is back
    assert trial.tensor("w").value(2).tolist() == [2.0] * 4
    assert trial.corrupt_steps() == []


def test_a_store_that_does_not_answer_is_no_missing_file(s3_uri, s3_server):
    write_run(s3_uri)
    store = Store(s3_uri)
    assert store.exists(END_OF_JOB_FILE) and not store.exists("no/such/file.json")
    assert store.list("no-such-folder") == [] and store.list_dirs("no-such-folder") == []
    assert store.read_many(["no/such/file.json"]) == {}
    s3_server.stop()
    for call in (
        lambda: store.exists("no/such/file.json"),
        lambda: store.list("index"),
        lambda: store.list_dirs("index"),
        lambda: store.read_bytes(END_OF_JOB_FILE),
    ):
        with pytest.raises(StoreUnavailableError) as info:
            call()
        one_clear_line(info.value, s3_uri)


@pytest.mark.parametrize("folder", ["exp[1]", "a*b?", "[!x]"])
def test_a_run_under_a_prefix_with_glob_characters_is_read(s3_uri, folder):
    base = s3_uri.rsplit("/", 1)[0]
    uri = f"{base}/{folder}/run"
    write_run(uri)
    write_run(f"{base}/exp1/run", steps=5)  # what "exp[1]" means as a glob: never read for it
    trial = create_trial(uri)
    assert trial.steps() == [0, 1, 2] and trial.training_ended()
    assert [trial.tensor("w").value(s).tolist() for s in trial.steps()] == [[s] * 4 for s in range(3)]
    store = Store(uri)
    index = store.list("index")
    assert len(index) == 3 and len(store.read_many(index)) == 3
    assert store.list_dirs("index") == ["index/000000000"]
    assert store.exists(END_OF_JOB_FILE)
    for command in (["ls", uri], ["rules", uri, "--rule", "all_zero", "--param", "tensor_regex=w"]):
        result = subprocess.run(
            [sys.executable, "-m", "smdebug", *command], capture_output=True, text=True, timeout=300
        )
        assert result.returncode in (0, 1), (command, result.stderr)
        assert "training ended" in result.stdout or "all_zero" in result.stdout, result.stdout


def test_memory_paths_with_glob_characters_are_read_exactly():
    import fsspec

    uri = "memory://glob-test/exp[1]/run"
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/glob-test/exp[1]/run/sub/a.json", b"A")
    fs.pipe_file("/glob-test/exp1/run/sub/a.json", b"other")
    store = Store(uri)
    assert store.read_many(["sub/a.json", "sub/missing.json"]) == {"sub/a.json": b"A"}
    assert store.list("sub") == ["sub/a.json"] and store.exists("sub/a.json")


def test_rules_watch_goes_on_through_an_outage(s3_uri, s3_server, tmp_path):
    """`smdebug rules --watch` on a live run whose endpoint goes down for a few seconds: it says so once
    on stderr and watches on (it died with botocore's traceback); the run's end then ends the watch."""
    marker = live_run(s3_uri)
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as stderr:
        watcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "smdebug",
                "rules",
                s3_uri,
                "--watch",
                "--rule",
                "all_zero",
                "--param",
                "tensor_regex=w",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        time.sleep(5)  # the watch is under way, waiting for step 3
        assert watcher.poll() is None, errors.read_text()
        s3_server.stop()
        deadline = time.monotonic() + 120
        while "cannot read the run" not in errors.read_text():
            assert watcher.poll() is None and time.monotonic() < deadline, errors.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(3)  # more attempts while the endpoint is down
        assert watcher.poll() is None, errors.read_text()[-3000:]
        s3_server.start()
        Store(s3_uri).write_bytes(END_OF_JOB_FILE, marker)  # the run ends: so does the watch
        stdout, _ = watcher.communicate(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    text = errors.read_text()
    assert watcher.returncode in (0, 1), text[-3000:]
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    assert text.count("cannot read the run") == 1, text  # said once
    assert "all_zero" in stdout
    assert SECRET_KEY not in text + stdout


def test_rules_without_watch_on_an_unreachable_run_is_one_line(s3_uri, s3_server):
    write_run(s3_uri)
    s3_server.stop()
    env = dict(os.environ, SMDEBUG_CLI_REACH_TIMEOUT="10")
    result = subprocess.run(
        [sys.executable, "-m", "smdebug", "rules", s3_uri],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and s3_uri in result.stderr, result.stderr


def test_a_rule_meeting_an_outage_is_no_broken_rule():
    """A rule whose read met an outage fails the command (one line, exit 2) or, with --watch, is asked
    again: it is not recorded as a broken rule."""
    from smdebug.cli.rules import _invoke, _State

    class Rule:
        def invoke(self, step):
            raise StoreUnavailableError("s3://b/run did not answer: EndpointConnectionError: ...")

    state = _State("r", Rule())
    with pytest.raises(StoreUnavailableError):
        _invoke(state, 0)
    assert state.error == ""
