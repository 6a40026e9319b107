"""Rule.req_tensors, smdebug 1.0's way for a rule to declare the tensors it needs at a step: invoke waits
for them and reads them first, and invoke_rule (evaluate_rule) skips a step whose required tensors are missing."""

import json

import numpy as np
import pytest

from smdebug import layout
from smdebug.collection import CollectionManager
from smdebug.exceptions import TensorUnavailable
from smdebug.modes import ModeKeys
from smdebug.rules import Rule, evaluate_rule
from smdebug.rules.req_tensors import RequiredTensors
from smdebug.store import Store
from smdebug.trials import create_trial
from smdebug.writing import RunWriter


def write_run(path, steps, names=("a", "b")):
    store = Store(str(path))
    writer = RunWriter(store, "worker_0")
    store.write_bytes(
        layout.collections_file_path("worker_0"), json.dumps(CollectionManager().to_json_dict()).encode()
    )
    for step in steps:
        for name in names:
            if name == "b" and step == 3:
                continue  # b is missing at step 3
            writer.write_tensor(step, ModeKeys.TRAIN, step, name, np.full(3, step, np.float32))
        writer.end_step(step)
    writer.close()
    store.write_bytes(layout.END_OF_JOB_FILE, b"")
    return str(path)


class NeedsPrevious(Rule):
    """Fires when b grew since the previous step; declares b at this step and the step before."""

    def __init__(self, base_trial):
        super().__init__(base_trial, action_str="")
        self.seen = []

    def set_required_tensors(self, step):
        if step > 0:
            self.req_tensors.add("b", [step - 1, step])

    def invoke_at_step(self, step):
        if step == 0:
            return False
        names = sorted(self.req_tensors.get_names())
        self.seen.append((step, names, sorted(t.name for t in self.req_tensors.get())))
        steps = self.req_tensors.get_tensor_steps("b")
        b = self.base_trial.tensor("b")
        return bool(b.value(steps[-1])[0] > b.value(steps[0])[0])


def test_rule_instances_have_req_tensors(tmp_path):
    trial = create_trial(write_run(tmp_path / "run", range(3)))
    rule = NeedsPrevious(trial)
    assert isinstance(rule.req_tensors, RequiredTensors)
    rule.req_tensors.add("a", [0, 1])
    rule.req_tensors.add("[ab]", [2], should_match_regex=True)
    assert sorted(rule.req_tensors.get_names()) == ["a", "b"]
    assert rule.req_tensors.get_tensor_steps("a") == [0, 1, 2]
    rule.req_tensors.clear()
    assert list(rule.req_tensors.get_names()) == []
    with pytest.raises(TensorUnavailable):
        rule.req_tensors.add("nope", [0])


def test_invoke_rule_fetches_the_required_tensors_and_skips_steps_missing_them(tmp_path):
    trial = create_trial(write_run(tmp_path / "run", range(6)))
    rule = NeedsPrevious(trial)
    fired = evaluate_rule(rule)
    # steps 3 (b missing) and 4 (b missing at step 3, the previous one) are skipped before invoke_at_step
    assert [s for s, *_ in rule.seen] == [1, 2, 5]
    assert rule.seen[0][1:] == (["b"], ["b"])
    assert fired == [1, 2, 5]


def test_required_tensors_of_another_trial(tmp_path):
    base = create_trial(write_run(tmp_path / "base", range(2)))
    other = create_trial(write_run(tmp_path / "other", range(2), names=("c",)))
    required = RequiredTensors(base, [other])
    required.add("c", [1], trial=other)
    required.add("a", [0])
    required.fetch()
    assert list(required.get_names(trial=other)) == ["c"]
    assert list(required.get_names()) == ["a"]


def test_required_tensors_are_importable_from_smdebug_rules():
    # smdebug 1.0 exports them there, beside Rule and invoke_rule
    from smdebug.rules import RequiredTensors as exported
    from smdebug.rules import RequiredTensorsForTrial
    from smdebug.rules.req_tensors import RequiredTensorsForTrial as defined

    assert exported is RequiredTensors and RequiredTensorsForTrial is defined
