"""The on-disk layout lives in smdebug.layout: the writer writes it, the Trial reads it, Tensor reads through
the Trial's public interface only."""

import ast
import inspect
import json

import numpy as np

from smdebug import layout
from smdebug.modes import ModeKeys
from smdebug.store import Store
from smdebug.trials import create_trial, tensor, trial
from smdebug.writing import RunWriter, outbox, thread_writer


def test_writer_publishes_its_files_where_layout_says(tmp_path):
    out = tmp_path / "run"
    w = RunWriter(Store(str(out)), "worker_0")
    w.write_tensor(1005, ModeKeys.TRAIN, 3, "x", np.arange(3, dtype=np.float32))
    w.write_shape(1005, ModeKeys.TRAIN, 3, "y", (2, 5))
    w.end_step(1005)
    assert w.close() == {}
    event = out / layout.event_file_path(1005, "worker_0")
    index = out / layout.index_file_path(1005, "worker_0")
    assert event.is_file() and index.is_file()
    assert layout.index_file_path(1005, "worker_0") == "index/000000001/000000001005_worker_0.json"
    assert layout.parse_index_file_name(str(index)) == (1005, "worker_0")
    record = layout.decode_index(index.read_bytes())
    assert (record.mode, record.mode_step) == ("TRAIN", 3)
    assert record.event_file == layout.event_file_path(1005, "worker_0")
    assert [name for name, *_ in record.tensors] == ["x"]
    assert record.tensors[0][3] is not None  # the payload's CRC
    assert record.shapes == [("y", (2, 5))]
    # the schema's field names, as smdebug 1.0 reads them
    raw = json.loads(index.read_bytes())
    assert set(raw) == {layout.META, layout.TENSOR_PAYLOAD, layout.SHAPE_PAYLOAD}
    assert set(raw["tensor_payload"][0]) == {"tensorname", "start_idx", "length", "crc32c"}


def test_trial_reads_a_run_laid_out_by_layout_alone(tmp_path):
    """A run assembled by hand from layout's functions (no writer) is what the Trial reads."""
    from smdebug import codec

    out = tmp_path / "run"
    store = Store(str(out))
    for step in (0, 2000):
        event = codec.encode_tensor_event(
            "w", np.full(2, step, np.float64), step, 0.0, ModeKeys.EVAL.value, step
        )
        rec = codec.frame(event, checksum=False)
        store.write_bytes(layout.event_file_path(step, "w0"), rec)
        entry = layout.tensor_entry("w", 0, len(rec))
        index = layout.encode_index("EVAL", step // 1000, layout.event_file_path(step, "w0"), [entry], [])
        store.write_bytes(layout.index_file_path(step, "w0"), index)
    store.write_bytes(layout.END_OF_JOB_FILE, b"")
    t = create_trial(str(out))
    assert t.steps() == [0, 2000]
    assert t.steps(mode=ModeKeys.EVAL) == [0, 2]
    assert t.training_ended()
    assert t.tensor("w").value(2000).tolist() == [2000.0, 2000.0]


def _private_trial_uses(module) -> set:
    """Underscored attributes read from ``self.trial`` / ``trial`` in a module."""
    found = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            base = node.value
            if isinstance(base, ast.Attribute) and base.attr == "trial":
                found.add(node.attr)
            elif isinstance(base, ast.Name) and base.id == "trial":
                found.add(node.attr)
    return found


def test_tensor_reads_through_the_trials_public_interface():
    assert _private_trial_uses(tensor) == set()
    for name in ("read_record", "is_step_complete", "saved_steps", "lookup_global_step", "maybe_refresh"):
        assert callable(getattr(trial.Trial, name)), name


def test_writer_and_trial_hold_no_layout_literals_of_their_own():
    for module in (thread_writer, outbox, trial):
        source = inspect.getsource(module)
        for literal in (
            '"training_job_end.ts"',
            '"tensor_payload"',
            '"start_idx"',
            ".tfevents",
            "_collections.json",
        ):
            assert literal not in source, (module.__name__, literal)


def test_index_entries_given_as_json_are_the_bytes_of_their_dicts():
    records = [("w", 0, 30, 7), ('odd "name" \u00e9\\', 30, 31, 4294967295)]
    entries = [layout.tensor_entry(name, 100 + start, size, crc) for name, start, size, crc in records]
    shapes = [layout.shape_entry("w", (2, 3))]
    as_json = layout.tensor_entries_json(records, 100)
    index = layout.encode_index("EVAL", 4, "events/x", as_json, shapes)
    assert index == layout.encode_index("EVAL", 4, "events/x", entries, shapes)
    expected = {"meta": {"mode": "EVAL", "mode_step": 4, "event_file_name": "events/x"}}
    expected.update({"tensor_payload": entries, "shape_payload": shapes})
    assert index == json.dumps(expected).encode()
