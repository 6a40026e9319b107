"""Resume after preemption (SageMaker managed spot training), compatible with smdebug 1.0.

With a checkpoint configuration (``$CHECKPOINT_CONFIG_FILE_PATH``, by default
``/opt/ml/input/config/checkpointconfig.json``, holding ``{"LocalPath": "<folder>"}``) a hook watches the
folder where the training script keeps its checkpoints. Whenever the script's files there change, the hook
appends its state to ``<folder>/metadata.json``, in smdebug 1.0's form: a JSON list of
``{"training-run", "latest-global-step-saved", "latest-global-step-seen", "latest-mode-step": {mode name:
step}}`` (we add ``"out-dir"`` and ``"process"``, which 1.0 ignores). A hook started later with the same
configuration (the job restarted from that checkpoint) takes the state with the latest step seen and
numbers its steps on from the step after it; its mode steps go on likewise.

When the restarted job (another process) writes to the run the earlier one wrote (the same out_dir), the
run reads as one history: the steps the earlier job saved after its last checkpoint are trained again, so
this worker's files of those steps are removed when the hook starts (with one warning naming them), the
later job saves them anew, and a step never has two values. The end-of-job marker goes too: the run goes
on.

The check is cheap at every step boundary: on Linux an inotify watch of the folder, polled without
waiting (a fraction of a microsecond; the kernel queues events as the script writes, so the step that
wrote a checkpoint is known exactly, as 1.0's scan of the folder at every step knew it); elsewhere a scan
of the folder at most once a second (and never more than 1% of the time). The folder is scanned to
confirm a change (file names, sizes and modification times) only after an event. Nothing here ever
breaks training: a problem is logged once and the watch stops.
"""

from __future__ import annotations

import json
import logging
import os
import select
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any

from smdebug import layout
from smdebug.modes import ModeKeys

if TYPE_CHECKING:
    from smdebug.hook import BaseHook

logger = logging.getLogger("smdebug")

CONFIG_FILE_PATH_ENV = "CHECKPOINT_CONFIG_FILE_PATH"
DEFAULT_CONFIG_PATH = "/opt/ml/input/config/checkpointconfig.json"
LOCAL_PATH_KEY = "LocalPath"
STATE_FILE = "metadata.json"  # smdebug 1.0's name
TRAINING_RUN = "training-run"
STEP_SAVED = "latest-global-step-saved"
STEP_SEEN = "latest-global-step-seen"
MODE_STEPS = "latest-mode-step"
OUT_DIR = "out-dir"  # ours: which run the state's steps were saved to
PROCESS = "process"  # ours: the process that recorded it (only another process's run is taken over)
_PROCESS = uuid.uuid4().hex
_TEMP_PREFIX = f".{STATE_FILE}."
SCAN_SECONDS = 1.0  # without inotify: the folder is scanned at most this often
SCAN_SHARE = 0.01  # ... and for at most this share of the time


def checkpoint_folder() -> str | None:
    """The checkpoint folder of the checkpoint configuration, None without one."""
    path = os.environ.get(CONFIG_FILE_PATH_ENV) or DEFAULT_CONFIG_PATH
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            folder = json.load(f).get(LOCAL_PATH_KEY)
    except (OSError, ValueError, AttributeError) as exc:
        logger.warning("smdebug: ignoring the checkpoint configuration %s: %s", path, exc)
        return None
    if not isinstance(folder, str) or not folder:
        logger.warning(
            "smdebug: the checkpoint configuration %s has no %s: no resuming", path, LOCAL_PATH_KEY
        )
        return None
    return folder


def read_states(folder: str) -> list[dict]:
    """The states recorded in a checkpoint folder, oldest first; entries that are not states are skipped."""
    path = os.path.join(folder, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        logger.warning("smdebug: ignoring %s, which cannot be read: %s", path, exc)
        return []
    return [s for s in data if _is_state(s)] if isinstance(data, list) else []


def _is_state(state: Any) -> bool:
    return (
        isinstance(state, dict)
        and _is_step(state.get(STEP_SEEN))
        and isinstance(state.get(MODE_STEPS, {}), dict)
        and all(k in ModeKeys.__members__ and _is_step(v) for k, v in state.get(MODE_STEPS, {}).items())
    )


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= -1


def latest_state(states: list[dict]) -> dict | None:
    """The state to resume from: the one with the latest step seen (as smdebug 1.0 picks it)."""
    return max(states, key=lambda s: s[STEP_SEEN], default=None)


def resume_numbering(hook: BaseHook) -> CheckpointWatcher | None:
    """Called when a hook is created: resume its step numbering from the checkpoint folder's state, and
    watch the folder. None without a checkpoint configuration (or for a dry run or a worker's copy)."""
    if hook.dry_run or hook.is_copy:
        return None
    folder = checkpoint_folder()
    if folder is None:
        return None
    try:
        states = read_states(folder)
        state = latest_state(states)
        watcher = CheckpointWatcher(hook, folder, states)
        if state is not None:
            watcher.resume_from(state)
        return watcher
    except Exception as exc:  # never break training: the hook numbers its steps from 0
        logger.warning(
            "smdebug: cannot watch the checkpoint folder %s: %s: %s", folder, type(exc).__name__, exc
        )
        return None


class CheckpointWatcher:
    """A hook's watch of the checkpoint folder, and the states it records there."""

    def __init__(self, hook: BaseHook, folder: str, states: list[dict]):
        self.hook = hook
        self.folder = folder
        self.states = states
        self.training_run = 0
        self.resumed_from: int | None = None  # the step seen of the state the hook resumed from
        self.continues_run = False  # the hook writes on in the run its state's steps were saved to
        # what the earlier job recorded of its steps up to the checkpoint's (unsaved steps, health), which
        # this hook's own records go on from
        self.records_before: dict = {}
        from smdebug.store import Store

        # a run saved inside the checkpoint folder is not the script's checkpoint
        self._run = Store.place(hook.out_dir)
        self._inotify = _Inotify.open()
        self._files = self._scan()
        self._next_scan = 0.0
        self._broken = False

    # -- resuming ----------------------------------------------------------------------------------
    def resume_from(self, state: dict) -> None:
        hook, seen = self.hook, state[STEP_SEEN]
        self.resumed_from = seen
        self.training_run = state.get(TRAINING_RUN, 0) + 1 if _is_step(state.get(TRAINING_RUN)) else 1
        hook.step = seen
        for name, step in state.get(MODE_STEPS, {}).items():
            hook.mode_steps[ModeKeys[name]] = step
        hook.mode_steps[ModeKeys.GLOBAL] = seen
        saved = state.get(STEP_SAVED)
        hook.last_saved_step = saved if _is_step(saved) and saved <= seen else None
        logger.info(
            "smdebug: resuming after step %d (training run %d, from %s)", seen, self.training_run, self.folder
        )
        # the run the state's steps were saved to is taken over by a restarted job only (another process:
        # a second hook of this job writing there is refused, as without a checkpoint configuration)
        self.continues_run = (
            state.get(OUT_DIR) == _run_location(hook.out_dir) and state.get(PROCESS) != _PROCESS
        )
        if self.continues_run:
            self._continue_run(seen)

    def _continue_run(self, seen: int) -> None:
        """Make the run in out_dir this worker's to go on writing after step ``seen``: its later steps,
        the end-of-job marker and the earlier job's claim of the worker's name go (at most the check
        timeout; the hook's writer starts only after this)."""
        from smdebug import plugins
        from smdebug.layout import DEFAULT_WORKER
        from smdebug.store import redact
        from smdebug.writing.bounded import run_bounded
        from smdebug.writing.settings import check_timeout_from_env

        hook = self.hook
        try:
            worker = hook.worker_name()
        except Exception:  # a plugin not initialised yet
            worker = DEFAULT_WORKER
        dropped: list[int] = []
        left: list[str] = []
        cancelled = threading.Event()

        def prepare() -> None:
            store = plugins.open_store(hook.out_dir)
            dropped.extend(drop_steps_after(store, worker, seen, cancelled))
            self.records_before = _records_until(store, worker, seen)
            # the earlier job, gone, may have been killed while it wrote a file: its temp file goes too
            left.extend(store.remove_left_temp_files(lambda name: layout.is_worker_file(name, worker)))
            for relpath in (
                layout.END_OF_JOB_FILE,
                layout.ended_note_path(worker),
                layout.writer_claim_path(worker),
            ):
                if not cancelled.is_set() and store.exists(relpath):
                    store.remove(relpath)
            if store.is_local:
                try:
                    os.rmdir(store.path(layout.WRITERS_DIR))
                except OSError:  # another worker's claim is there, or the folder is not
                    pass

        try:
            run_bounded(prepare, check_timeout_from_env())
        except Exception as exc:
            cancelled.set()  # nothing more is removed: the hook's own steps may be written from now on
            logger.warning(
                "smdebug: could not prepare %s to go on after step %d: %s: %s",
                redact(hook.out_dir),
                seen,
                type(exc).__name__,
                exc,
            )
        if left:
            logger.info(
                "smdebug: %s: removed %d unfinished file(s) the earlier job of %s left (e.g. %s.tmp-...)",
                redact(hook.out_dir),
                len(left),
                worker,
                left[0],
            )
        if dropped:
            logger.warning(
                "smdebug: %s: removed %s's steps %s, saved after the checkpoint of step %d: they are trained "
                "again",
                redact(hook.out_dir),
                worker,
                _step_list(dropped),
                seen,
            )

    # -- watching ----------------------------------------------------------------------------------
    def step_boundary(self) -> None:
        """Between two steps (the hook's step is the one that ended): record the state if the
        checkpoint files changed. Cheap when they did not."""
        inotify = self._inotify
        if inotify is not None and inotify.watching:
            if not inotify.pending():
                return
            inotify.drain()
        elif time.monotonic() < self._next_scan:
            return
        self._check()

    def close(self) -> None:
        """The hook closes: a checkpoint written after its last step is recorded too (by a hook that ran
        a step: not by one that a script's own replaced before training)."""
        if self.hook.step != (-1 if self.resumed_from is None else self.resumed_from):
            self._check()
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    def _check(self) -> None:
        if self._broken:
            return
        try:
            started = time.monotonic()
            files = self._scan()
            if self._inotify is None or not self._inotify.watching:
                took = time.monotonic() - started
                self._next_scan = started + max(SCAN_SECONDS, took / SCAN_SHARE)
            if files != self._files:
                self._files = files
                if files:  # as 1.0: only the script's own files count, and some must be there
                    self.record()
        except Exception as exc:  # never break training: the watch stops
            self._broken = True
            logger.warning(
                "smdebug: stopped watching the checkpoint folder %s: %s: %s",
                self.folder,
                type(exc).__name__,
                exc,
            )

    def _scan(self) -> dict[str, tuple[int, int]]:
        """The script's files in the folder: relative path -> (size, modification time)."""
        found: dict[str, tuple[int, int]] = {}
        if self._inotify is not None:
            self._inotify.watch_root(self.folder)
        folders = [self.folder]
        while folders:
            folder = folders.pop()
            try:
                entries = list(os.scandir(folder))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if os.path.realpath(entry.path) == self._run:
                            continue
                        folders.append(entry.path)
                        if self._inotify is not None:
                            self._inotify.watch(entry.path)
                    elif _is_checkpoint_file(entry.name):
                        st = entry.stat()
                        found[os.path.relpath(entry.path, self.folder)] = (st.st_size, st.st_mtime_ns)
                except FileNotFoundError:  # removed meanwhile
                    continue
        return found

    def record(self) -> None:
        """Append the hook's state to the folder's state file (replaced whole: a reader never sees half)."""
        hook = self.hook
        state = {
            TRAINING_RUN: self.training_run,
            STEP_SAVED: hook.last_saved_step,
            STEP_SEEN: hook.step,
            MODE_STEPS: {mode.name: step for mode, step in hook.mode_steps.items()},
            OUT_DIR: _run_location(hook.out_dir),
            PROCESS: _PROCESS,
        }
        self.states.append(state)
        os.makedirs(self.folder, exist_ok=True)
        temp = os.path.join(self.folder, f"{_TEMP_PREFIX}{os.getpid()}.{threading.get_ident()}")
        with open(temp, "w", encoding="utf-8") as f:
            json.dump(self.states, f)
        os.replace(temp, os.path.join(self.folder, STATE_FILE))
        logger.debug("smdebug: checkpoint after step %d recorded in %s", hook.step, self.folder)


def _run_location(out_dir: str) -> str:
    """An out_dir as the state records it: a local folder by its absolute path, any other URI as it is."""
    from smdebug.store import Store, redact

    if Store.is_plain_local(out_dir):
        return os.path.abspath(out_dir.removeprefix("file://"))
    return redact(out_dir)  # (no credentials in the user's checkpoint folder)


def _is_checkpoint_file(name: str) -> bool:
    # not the state file, nor SageMaker's markers of uploaded files (1.0 skips those names too)
    return name != STATE_FILE and not name.startswith(_TEMP_PREFIX) and "sagemaker-uploaded" not in name


def _records_until(store, worker: str, seen: int) -> dict:
    """The worker's records of the run as of step ``seen`` (those of the steps after it, trained again, go):
    its rule firings, unsaved steps and health record, rewritten so; the last two are returned too
    ("unsaved": step -> reason, "health": the record), for this hook's own records to go on from. A
    record that cannot be read is left as it is."""
    from smdebug.firings import firings_path
    from smdebug.health import health_record_path

    def until(items) -> list:
        return [
            i for i in items if isinstance(i, dict) and isinstance(i.get("step"), int) and i["step"] <= seen
        ]

    kept: dict = {}
    for path in (firings_path(worker), layout.unsaved_steps_path(worker), health_record_path(worker)):
        try:
            if not store.exists(path):
                continue
            record = json.loads(store.read_bytes(path))
            if path == firings_path(worker):
                record["firings"] = until(record["firings"])
            elif path == health_record_path(worker):
                first = record.get("first_nonfinite")
                record["first_nonfinite"] = first if until([first]) else None
                record["triggers"] = until(record.get("triggers") or [])
                kept["health"] = record
            else:
                record["unsaved_steps"] = until(record["unsaved_steps"])
                kept["unsaved"] = {i["step"]: str(i.get("reason")) for i in record["unsaved_steps"]}
                if not record["unsaved_steps"] and not record.get("unsaved_files"):
                    store.remove(path)
                    continue
            store.write_bytes(path, json.dumps(record, indent=1).encode())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.debug("smdebug: %s left as it is: %s", path, exc)
    return kept


def drop_steps_after(store, worker: str, seen: int, cancelled: threading.Event | None = None) -> list[int]:
    """Remove a worker's steps after ``seen`` from a run (each step's index first, so a reader never
    finds an index without its events); the steps removed."""
    steps: set[int] = set()
    first = layout.index_dir(seen + 1)
    for folder in store.list_dirs(layout.INDEX_DIR):
        if folder < first:
            continue
        for relpath in store.list(folder):
            parsed = layout.parse_index_file_name(relpath)
            if parsed is not None and parsed[1] == worker and parsed[0] > seen:
                steps.add(parsed[0])
    for folder in store.list_dirs(layout.EVENTS_DIR):
        name = folder.rsplit("/", 1)[-1]
        if name.isdigit() and int(name) > seen and store.exists(layout.event_file_path(int(name), worker)):
            steps.add(int(name))
    for step in sorted(steps):
        if cancelled is not None and cancelled.is_set():
            break
        for relpath in (layout.index_file_path(step, worker), layout.event_file_path(step, worker)):
            if store.exists(relpath):
                store.remove(relpath)
        if store.is_local:  # the step's folder, when no other worker's file is left in it
            try:
                os.rmdir(store.path(f"{layout.EVENTS_DIR}/{step:012d}"))
            except OSError:
                pass
    return sorted(steps)


def _step_list(steps: list[int]) -> str:
    """Steps for a message: "5-9" for a range, else the list."""
    if len(steps) > 2 and steps[-1] - steps[0] == len(steps) - 1:
        return f"{steps[0]}-{steps[-1]}"
    return ", ".join(str(s) for s in steps)


class _Inotify:
    """Linux's inotify through libc (no dependency): a watch of the checkpoint folder and its subfolders,
    polled without waiting at each step boundary."""

    # IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
    MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200
    CREATED = 0x80 | 0x100  # IN_MOVED_TO | IN_CREATE

    def __init__(self, libc, fd: int):
        self._libc = libc
        self.fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._closer = weakref.finalize(self, _close_fd, fd)  # a hook never closed does not keep it
        self.watching = False  # the checkpoint folder itself is watched (until then: scans)

    @classmethod
    def open(cls) -> _Inotify | None:
        """An inotify instance, or None where there is none (not Linux, no libc, no instances left)."""
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            init = libc.inotify_init1
            libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
            fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError, ImportError, TypeError):
            return None
        return cls(libc, fd) if fd >= 0 else None

    def watch(self, path: str, mask: int = MASK) -> bool:
        """Watch a folder; at each scan again (the same folder keeps its watch, one made anew gets one)."""
        return self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask) >= 0

    def watch_root(self, path: str) -> None:
        """Watch the checkpoint folder; while it is not there, the entries made in its nearest existing
        parent (its creation is an event: a script that makes it at its first checkpoint). Until either
        works (the limit of watches is reached) the folder is scanned at intervals instead."""
        self.watching = self.watch(path)
        if self.watching or os.path.exists(path):
            return
        parent = os.path.dirname(os.path.abspath(path))
        while parent != os.path.dirname(parent) and not os.path.isdir(parent):
            parent = os.path.dirname(parent)
        self.watching = self.watch(parent, self.CREATED)

    def pending(self) -> bool:
        return bool(self._poll.poll(0))

    def drain(self) -> None:
        try:
            while os.read(self.fd, 65536):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        self._closer()


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
