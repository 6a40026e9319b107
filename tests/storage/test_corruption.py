"""Damaged runs: truncated and bit-flipped event files are found by record CRCs, reported with file and
offset, and skipped; malformed index or collections JSON gives a clear error."""

from __future__ import annotations

import json
import logging
import os
import re

import numpy as np
import pytest

import smdebug
from smdebug.exceptions import CorruptRunError, CorruptTensorRecord, TensorUnavailableForStep
from smdebug.hook import BaseHook
from smdebug.rules.rule import Rule
from smdebug.rules.rule_invoker import evaluate_rule
from smdebug.trials import create_trial

NAMES = ["a", "b", "c"]


@pytest.fixture
def run(tmp_path):
    out = str(tmp_path / "run")
    hook = BaseHook(out_dir=out, save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(4):
        hook.begin_step()
        for i, name in enumerate(NAMES):
            hook.save_tensor(name, np.full((8, 8), 10 * step + i, dtype=np.float32))
    hook.close()
    return out


def event_file(run, step):
    return os.path.join(run, "events", f"{step:012d}", f"{step:012d}_worker_0.tfevents")


def index_entries(run, step):
    path = os.path.join(run, "index", "000000000", f"{step:012d}_worker_0.json")
    with open(path) as f:
        return {t["tensorname"]: t for t in json.load(f)["tensor_payload"]}, path


def assert_rest_readable(trial, skip):
    for step in range(4):
        for i, name in enumerate(NAMES):
            if (name, step) in skip:
                continue
            assert trial.tensor(name).value(step)[0, 0] == 10 * step + i


def test_bit_flip_in_a_tensor_is_detected_reported_and_skipped(run, caplog):
    entries, _ = index_entries(run, 2)
    b = entries["b"]
    path = event_file(run, 2)
    with open(path, "r+b") as f:  # flip one bit inside b's tensor data, in the middle of the record
        f.seek(b["start_idx"] + b["length"] - 40)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    caplog.set_level(logging.WARNING, logger="smdebug")
    trial = create_trial(run)
    for _ in range(2):  # reported once, raised every time
        with pytest.raises(CorruptTensorRecord) as info:
            trial.tensor("b").value(2)
    message = str(info.value)
    assert "events/000000000002/000000000002_worker_0.tfevents" in message
    assert f"offset {b['start_idx']}" in message and "checksum" in message
    assert isinstance(info.value, CorruptRunError) and isinstance(info.value, TensorUnavailableForStep)
    warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warnings) == 1 and f"offset {b['start_idx']}" in warnings[0]
    assert_rest_readable(trial, {("b", 2)})
    # the step is listed once its damaged record was read (its other records stay readable)
    assert trial.corrupt_steps() == [2] and "000000000002_worker_0.tfevents" in trial.corrupt()["worker_0"][2]


def test_truncated_event_file_keeps_earlier_records_and_other_steps(run, caplog):
    entries, _ = index_entries(run, 1)
    path = event_file(run, 1)
    cut = entries["b"]["start_idx"] + 20  # inside b: b and c are gone, a is whole
    with open(path, "r+b") as f:
        f.truncate(cut)
    caplog.set_level(logging.WARNING, logger="smdebug")
    trial = create_trial(run)
    for name in ("b", "c"):
        with pytest.raises(
            CorruptTensorRecord,
            match=rf"000000000001_worker_0\.tfevents: record at offset "
            rf"{entries[name]['start_idx']} .*truncated",
        ):
            trial.tensor(name).value(1)
    assert_rest_readable(trial, {("b", 1), ("c", 1)})
    assert sorted(trial.tensor("b").values()) == [0, 2, 3]  # values() skips the damaged one
    assert len([r for r in caplog.records if "damaged" in r.getMessage()]) == 2


def test_damaged_length_field_is_detected(run):
    entries, _ = index_entries(run, 3)
    with open(event_file(run, 3), "r+b") as f:
        f.seek(entries["c"]["start_idx"] + 2)
        f.write(b"\xff")
    trial = create_trial(run)
    with pytest.raises(CorruptTensorRecord, match="length field"):
        trial.tensor("c").value(3)
    assert_rest_readable(trial, {("c", 3)})


def test_missing_event_file_is_reported_not_a_crash(run):
    os.remove(event_file(run, 0))
    trial = create_trial(run)
    with pytest.raises(CorruptTensorRecord, match="000000000000_worker_0.tfevents"):
        trial.tensor("a").value(0)
    assert_rest_readable(trial, {(n, 0) for n in NAMES})


def test_rules_pass_over_a_damaged_value(run):
    with open(event_file(run, 2), "r+b") as f:
        f.truncate(10)

    class Sees(Rule):
        def __init__(self, base_trial):
            super().__init__(base_trial)
            self.seen = []

        def invoke_at_step(self, step):
            self.seen.append((step, float(self.base_trial.tensor("a").value(step)[0, 0])))

    rule = Sees(create_trial(run))
    evaluate_rule(rule)
    assert rule.seen == [(0, 0.0), (1, 10.0), (3, 30.0)]


@pytest.mark.parametrize(
    "content, problem",
    [
        (b'{"meta": {"mode": "GLOBAL", "mode_st', "JSON|Expecting|Unterminated"),
        (b'{"meta": {}, "tensor_payload": [{"tensorname": "a"}]}', "start_idx"),
        (b"[1, 2]", "malformed"),
        (b"\xff\xfe", "malformed"),
    ],
)
def test_malformed_index_file_skips_its_step_and_says_so(run, content, problem, caplog):
    _, path = index_entries(run, 1)
    with open(path, "wb") as f:
        f.write(content)
    caplog.set_level(logging.WARNING, logger="smdebug")
    trial = create_trial(run)  # the rest of the run reads: only step 1 is left out
    assert trial.steps() == [0, 2, 3] and trial.tensor("a").steps() == [0, 2, 3]
    assert trial.corrupt_steps() == [1]
    message = trial.corrupt()["worker_0"][1]
    assert "index/000000000/000000000001_worker_0.json" in message and "malformed index file" in message
    assert re.search(problem, message)
    warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warnings) == 1 and "step 1" in warnings[0] and "000000000001_worker_0.json" in warnings[0]
    trial.refresh()  # not read (nor said) again
    assert len([r for r in caplog.records if "damaged" in r.getMessage()]) == 1
    assert_rest_readable(trial, {(name, 1) for name in NAMES})


@pytest.mark.parametrize("content", [b"{not json", b'{"collections": 3}', b"null"])
def test_malformed_collections_file_gives_a_clear_error(run, content):
    path = os.path.join(run, "collections", "000000000", "worker_0_collections.json")
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CorruptRunError, match=r"worker_0_collections\.json: malformed collections file"):
        create_trial(run)
