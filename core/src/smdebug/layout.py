"""The on-disk layout of a run, as smdebug 1.0 has it: one place for what the writer and the Trial share.

    <run>/events/<step:012d>/<step:012d>_<worker>.tfevents     the step's records (TFRecord framing)
    <run>/index/<step // 1000:09d>/<step:012d>_<worker>.json    where each record of the step is
    <run>/collections/000000000/<worker>_collections.json       the worker's collections
    <run>/training_job_end.ts                                   written when training has ended
    <run>/writers/<worker>.json                                 the worker's claim of its name (ours)
    <run>/unsaved_steps/<worker>.json                           steps the worker could not save (ours)
    <run>/tensor_notes/<worker>.json                            shard placements, tensors not captured (ours)
    <run>/ended/<worker>.json                                   the worker of a distributed run has ended (ours)

An index file is JSON: ``{"meta": {"mode", "mode_step", "event_file_name"}, "tensor_payload": [{"tensorname",
"start_idx", "length", "crc32c"}], "shape_payload": [{"tensorname", "originalname", "shape"}]}``. ``crc32c``
(the record payload's masked CRC32C) is ours; smdebug 1.0 ignores keys it does not know.

The end-of-job file of a distributed run is written by the last of its writing workers (those with a
collections file) to end: each writes its ``ended/`` note first, and the one that then finds every such
worker's note writes it (of two ending together, the later note's writer finds both), and removes the notes.
``writers/``, ``ended/`` and ``unsaved_steps/`` are ours too: smdebug 1.0's reader only lists ``index/``,
``collections/000000000/`` and ``events/`` and looks for the end-of-job file, so it never sees them (their
names must not start with "index": on S3 it lists the prefix ``<run>/index`` without a slash).
An unsaved-steps file is JSON: ``{"worker", "unsaved_steps": [{"step", "reason"}], "unsaved_files":
[{"file", "reason"}]}``, written at close before the end-of-job file.
A tensor-notes file (only in runs that have something to note: an unsharded run has none) is JSON:
``{"worker", "placements": {name: {"global_shape", "offsets", "local_shape", "mesh_shape", "coordinate",
"placements"}}, "unsaved": {name: {"step", "reason"}}}``: where the worker's saved value of a sharded tensor
lies in the full tensor, and the tensors it could not capture (the first step, and why).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat

from smdebug.exceptions import SMDebugValueError

END_OF_JOB_FILE = "training_job_end.ts"
EVENTS_DIR = "events"
INDEX_DIR = "index"
COLLECTIONS_DIR = "collections"
WRITERS_DIR = "writers"
UNSAVED_DIR = "unsaved_steps"
NOTES_DIR = "tensor_notes"
ENDED_DIR = "ended"
DEFAULT_WORKER = "worker_0"  # the worker name of a job that is not distributed
STEPS_PER_INDEX_DIR = 1000  # index files are grouped in folders of this many steps
MAX_NUMBER = 2**62  # steps, offsets and lengths of a run are below it (a larger one is damage)

# index schema
META, MODE, MODE_STEP, EVENT_FILE_NAME = "meta", "mode", "mode_step", "event_file_name"
TENSOR_PAYLOAD, SHAPE_PAYLOAD = "tensor_payload", "shape_payload"
TENSORNAME, ORIGINALNAME, START_IDX, LENGTH, CRC32C, SHAPE = (
    "tensorname",
    "originalname",
    "start_idx",
    "length",
    "crc32c",
    "shape",
)

INDEX_FILE_NAME = re.compile(r"(?:^|/)(\d+)_(.+)\.json$")  # step, worker
COLLECTIONS_FILE_NAME = re.compile(r"(?:^|/)(.+)_collections\.json$")  # worker


def event_file_path(step: int, worker: str) -> str:
    return f"{EVENTS_DIR}/{step:012d}/{step:012d}_{worker}.tfevents"


def index_dir(step: int) -> str:
    return f"{INDEX_DIR}/{step // STEPS_PER_INDEX_DIR:09d}"


def index_file_path(step: int, worker: str) -> str:
    return f"{index_dir(step)}/{step:012d}_{worker}.json"


def collections_file_path(worker: str) -> str:
    return f"{COLLECTIONS_DIR}/000000000/{worker}_collections.json"


def writer_claim_path(worker: str) -> str:
    return f"{WRITERS_DIR}/{worker}.json"


def unsaved_steps_path(worker: str) -> str:
    return f"{UNSAVED_DIR}/{worker}.json"


def tensor_notes_path(worker: str) -> str:
    return f"{NOTES_DIR}/{worker}.json"


def ended_note_path(worker: str) -> str:
    return f"{ENDED_DIR}/{worker}.json"


def parse_index_file_name(relpath: str) -> tuple[int, str] | None:
    """(step, worker) of an index file's path, or None when the name is not one."""
    match = INDEX_FILE_NAME.search(relpath)
    return (int(match.group(1)), match.group(2)) if match else None


def worker_from_file_name(name: str) -> str:
    """A worker's name as the Trial shows it, from the form file names hold. A TensorFlow device (each
    replica of a MirroredStrategy is a worker) is written ``_job-localhost_replica-0_task-0_device-CPU-0``
    (no ``/`` or ``:`` in a file name) and read back ``/job:localhost/replica:0/task:0/device:CPU:0``, as
    smdebug 1.0 reads it; any other name (``worker_0``, a device name already) is itself, so a name a
    user gives in either form can be passed through it."""
    return name.replace("_", "/").replace("-", ":") if name.startswith("_") else name


def worker_in_file_name(worker: str) -> str:
    """The form of a worker's name in file names (``worker_from_file_name``'s inverse)."""
    return worker.replace("/", "_").replace(":", "-")


def is_worker_file(name: str, worker: str) -> bool:
    """Whether a file name in a run is one of ``worker``'s own: its index, events, collections, or a
    record named after it (unsaved steps, notes, rule firings, health, its claim)."""
    own = worker_in_file_name(worker)
    if name in (f"{own}.json", f"{own}_collections.json"):
        return True
    step, sep, rest = name.partition("_")
    return bool(sep) and step.isdigit() and rest in (f"{own}.json", f"{own}.tfevents")


def is_collections_file(relpath: str) -> bool:
    return COLLECTIONS_FILE_NAME.search(relpath) is not None


def last_step_of_index_dir(folder: str) -> int | None:
    """The last step an index folder ("index/000000002") can hold, or None for another folder."""
    prefix = INDEX_DIR + "/"
    if not folder.startswith(prefix):
        return None
    try:
        number = int(folder[len(prefix) :])
    except ValueError:
        return None
    return (number + 1) * STEPS_PER_INDEX_DIR - 1


# -- index files ------------------------------------------------------------------------------------------
def tensor_entry(name: str, start: int, length: int, crc: int | None = None) -> dict:
    entry = {TENSORNAME: name, START_IDX: start, LENGTH: length}
    if crc is not None:
        entry[CRC32C] = crc
    return entry


def tensor_entries_json(records: list[tuple[str, int, int, int]], offset: int) -> list[str]:
    """The JSON encode_index writes for tensor_entry(name, offset + start, length, crc) of each record
    (name, start, length, crc): many records' entries made without a dict each."""
    quote = json.encoder.encode_basestring_ascii  # json.dumps' own, for its default ensure_ascii
    return [
        f'{{"{TENSORNAME}": {quote(name)}, "{START_IDX}": {offset + start}, "{LENGTH}": {length}, '
        f'"{CRC32C}": {crc}}}'
        for name, start, length, crc in records
    ]


def shape_entry(name: str, shape) -> dict:
    return {TENSORNAME: name, ORIGINALNAME: name, SHAPE: list(shape)}


def encode_index(
    mode_name: str, mode_step: int, event_file: str | None, tensors: list, shapes: list
) -> bytes:
    """An index file's bytes; ``tensors``/``shapes`` are lists of ``tensor_entry``/``shape_entry``
    (a tensor's entry may be given as its JSON already: ``tensor_entries_json``)."""
    meta = {MODE: mode_name, MODE_STEP: mode_step}
    if tensors:
        meta[EVENT_FILE_NAME] = event_file
    entries = ", ".join(t if type(t) is str else json.dumps(t) for t in tensors)
    head = json.dumps({META: meta})[:-1]
    return f'{head}, "{TENSOR_PAYLOAD}": [{entries}], "{SHAPE_PAYLOAD}": {json.dumps(shapes)}}}'.encode()


@dataclass
class IndexRecord:
    """What one index file says."""

    mode: object  # as written: a mode name ("TRAIN") or number; "GLOBAL" when the file does not say
    mode_step: int | None  # None when the file does not say (then it is the global step)
    event_file: str | None
    tensors: list[tuple[str, int, int, int | None]]  # (name, start, length, crc or None)
    shapes: list[tuple[str, tuple]]


def load_json(data: bytes | str):
    """A run's JSON file, parsed as untrusted: ValueError for a non-finite number (NaN, 1e999) or nesting
    deeper than the interpreter's recursion limit."""
    try:
        return json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a run holds")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} out of range")
    return value


def bounded_int(value, what: str, low: int = 0) -> int:
    """int(value), a step, offset or length: ValueError outside [low, MAX_NUMBER)."""
    number = int(value)
    if not low <= number < MAX_NUMBER:
        raise ValueError(f"{what} {number} out of range")
    return number


def decode_index(data: bytes) -> IndexRecord:
    """Parse an index file; ValueError, KeyError or TypeError when it is malformed."""
    index = _object(load_json(data), "the index")
    meta = _object(index[META], META)
    mode_step = meta.get(MODE_STEP)
    event_file = meta.get(EVENT_FILE_NAME)
    tensors = [
        (
            _name(t[TENSORNAME]),
            bounded_int(t[START_IDX], START_IDX),
            bounded_int(t[LENGTH], LENGTH),
            crc if isinstance(crc := t.get(CRC32C), int) else None,
        )
        for t in map(_object, index.get(TENSOR_PAYLOAD) or (), repeat(TENSOR_PAYLOAD))
    ]
    if tensors and not isinstance(event_file, str):
        raise ValueError(f"{META}.{EVENT_FILE_NAME} is missing")
    if isinstance(event_file, str) and not is_inside_run(event_file):
        raise ValueError(f"{META}.{EVENT_FILE_NAME} {event_file[:80]!r} is not a file of the run")
    shapes = [
        (_name(s[TENSORNAME]), tuple(d if d is None else bounded_int(d, SHAPE, -1) for d in s[SHAPE]))
        for s in map(_object, index.get(SHAPE_PAYLOAD) or [], repeat(SHAPE_PAYLOAD))
    ]
    return IndexRecord(
        meta.get(MODE, "GLOBAL"),
        None if mode_step is None else bounded_int(mode_step, MODE_STEP, -MAX_NUMBER),
        event_file,
        tensors,
        shapes,
    )


def _object(value, what: str):
    if not isinstance(value, dict):
        raise TypeError(f"{what} is a JSON {type(value).__name__}, not an object")
    return value


def is_inside_run(relpath: str) -> bool:
    """Whether a path is a relative path inside the run (no leading /, no empty, . or .. part, no NUL)."""
    parts = relpath.split("/")
    return (
        not relpath.startswith("/") and "\0" not in relpath and all(p not in ("", ".", "..") for p in parts)
    )


def _name(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{TENSORNAME} {str(value)[:40]} is not a string")
    return value


# -- unsaved steps ----------------------------------------------------------------------------------------
def encode_unsaved(worker: str, steps: dict[int, str], files: dict[str, str]) -> bytes:
    return json.dumps(
        {
            "worker": worker,
            "unsaved_steps": [{"step": int(s), "reason": r} for s, r in sorted(steps.items())],
            "unsaved_files": [{"file": f, "reason": r} for f, r in sorted(files.items())],
        }
    ).encode()


def decode_unsaved(data: bytes) -> dict[int, str]:
    """The unsaved steps of an unsaved-steps file (step -> reason); ValueError when it is malformed."""
    record = load_json(data)
    if not isinstance(record, dict) or not isinstance(record.get("unsaved_steps", []), list):
        raise ValueError("not an unsaved-steps record")
    out = {}
    for entry in record.get("unsaved_steps", []):
        out[bounded_int(entry["step"], "step")] = str(entry.get("reason", ""))[:500]
    return out


# -- tensor notes -----------------------------------------------------------------------------------------
def encode_notes(worker: str, placements: dict[str, dict], unsaved: dict[str, dict]) -> bytes:
    return json.dumps(
        {"worker": worker, "placements": placements, "unsaved": unsaved}, sort_keys=True
    ).encode()


def decode_notes(data: bytes) -> tuple[dict[str, dict], dict[str, dict]]:
    """(placements, unsaved tensors) of a tensor-notes file; ValueError when it is malformed."""
    record = load_json(data)
    if not isinstance(record, dict):
        raise ValueError("not a tensor-notes record")
    placements, unsaved = record.get("placements", {}), record.get("unsaved", {})
    if not isinstance(placements, dict) or not isinstance(unsaved, dict):
        raise ValueError("not a tensor-notes record")
    return placements, unsaved


# -- what a store holds -----------------------------------------------------------------------------------
def existing_run(store, worker: str | None) -> str | None:
    """What of an earlier run a store holds ("a finished smdebug run", ...), or None.

    With a worker name, that worker's own collections or index files count too (a crashed run);
    other workers' files may be those of the same distributed run, which share the directory.
    """
    if store.exists(END_OF_JOB_FILE):
        return f"a finished smdebug run ({END_OF_JOB_FILE} is there)"
    if worker is None:
        return None
    if store.exists(collections_file_path(worker)):
        return f"an earlier smdebug run of {worker} ({collections_file_path(worker)} is there)"
    folders = store.list_dirs(INDEX_DIR)
    if folders:
        suffix = f"_{worker}.json"
        mine = [p for p in store.list(folders[0]) if p.endswith(suffix)]
        if mine:
            return f"an earlier smdebug run of {worker} ({mine[0]} is there)"
    return None


# -- which runs -------------------------------------------------------------------------------------------
def is_run(store, root: str | None = None) -> bool:
    """Whether root (the store's own by default) holds an smdebug run (its index or collections folder);
    each question bounded by the read timeout."""
    root = store.root if root is None else root
    return any(store.ask(store.fs.exists, f"{root}/{name}") for name in (INDEX_DIR, COLLECTIONS_DIR))


def no_run_here(store, path: str) -> str:
    """Why a store holding no run's file is not one: no such folder, or a folder that holds no run."""
    if not store.ask(store.fs.exists, store.root):
        return f"{path}: no such file or directory"
    return f"{path}: no smdebug run found (no index or collections files)"


def find_runs(runs) -> list[str]:
    """The runs named by paths, URIs, globs (``runs/lr-*``, ``s3://bucket/sweep/*``) or folders holding
    runs (searched two levels down), or Trials; in the order given, each folder's runs sorted."""
    from smdebug import plugins

    if isinstance(runs, (str, os.PathLike)) or not isinstance(runs, Iterable):
        runs = [runs]
    found: list[str] = []
    for item in runs:
        if not isinstance(item, (str, os.PathLike)):
            found.append(item)  # a Trial
            continue
        uri = os.fspath(item).rstrip("/") or "/"
        store = plugins.open_store(uri)
        fs, root, ask = store.fs, store.root, store.ask
        prefix = uri[: len(uri) - len(uri.split("://", 1)[-1])] if "://" in uri else ""
        if any(c in root for c in "*?["):
            matches = sorted(ask(fs.glob, root))
        elif is_run(store):
            found.append(uri)
            continue
        elif not ask(fs.exists, root):
            found.append(uri)  # reported as an error row: no such folder
            continue
        else:
            matches = []
            for depth in ("*", "*/*"):
                for marker in (INDEX_DIR, COLLECTIONS_DIR):
                    matches += [m.rsplit("/", 1)[0] for m in ask(fs.glob, f"{root}/{depth}/{marker}")]
            matches = sorted(set(matches))
        for match in matches:
            if match.endswith("/" + INDEX_DIR) or match.endswith("/" + COLLECTIONS_DIR):
                continue
            path = f"{prefix}{match}" if prefix and not match.startswith(prefix) else match
            if path not in found and (not any(c in root for c in "*?[") or is_run(store, match)):
                found.append(path)
    if not found:
        where = ", ".join(map(str, runs))
        raise SMDebugValueError(f"no smdebug run found in {where}" if where else "no runs given")
    return found
