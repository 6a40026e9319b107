"""Where a remote run's finished files wait on local disk (spilled: the store is failing, or a file passed
the memory budget): one folder per process in the system temp dir, ``smdebug-staged-<random>``, holding a
lock (flock) for as long as its process lives, and a subfolder per run that names the run. Nothing is
written anywhere else.

A process that ends removes its folder unless files still wait in it. A process killed while its steps waited
for the store (kill -9 during an S3 outage) leaves its folder behind; the next process on the machine that
stages a remote run's file removes every such folder whose lock is free, with one warning naming the runs and
the steps they held (those steps are not in the run).

Older versions left loose ``smdebug-staged-*`` files in the temp dir instead (one per spilled file, named
after no process). One is removed, with one warning, only when its process is surely gone: no process has it
open, and no Python process of its owner that started before the file was last written is alive (Linux's
/proc tells; elsewhere none is removed)."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import stat
import tempfile
import threading

try:
    import fcntl
except ImportError:  # not POSIX: no lock, so no folder is known to be left over; none is removed
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("smdebug")

PREFIX = "smdebug-staged-"
_LOCK = "owner.lock"  # locked by the folder's process while it lives
_RUN = "run"  # in each run's subfolder: the run's URI

_lock = threading.Lock()
_folder: tuple[int, str, int] | None = None  # (pid, path, the lock's file descriptor) of this process
_runs: dict[str, str] = {}  # run URI -> its subfolder, in this process's folder
_swept: set[str] = set()  # temp dirs already swept by this process


def spill_file(uri: str, relpath: str) -> tuple[int, str]:
    """A new temp file (its descriptor and path) for ``relpath`` of the run at ``uri``, named after it."""
    with _lock:
        folder = _run_folder(uri)
    return tempfile.mkstemp(prefix=f"{os.path.basename(relpath)}.", dir=folder)


def _run_folder(uri: str) -> str:
    global _folder
    if _folder is None or _folder[0] != os.getpid():  # a forked child makes its own
        _runs.clear()
        _folder = _new_folder()
    folder = _runs.get(uri)
    if folder is None or not os.path.isdir(folder):
        folder = tempfile.mkdtemp(prefix="run-", dir=_folder[1])
        with open(os.path.join(folder, _RUN), "w", encoding="utf-8") as f:
            f.write(uri)
        _runs[uri] = folder
    return folder


def _new_folder() -> tuple[int, str, int]:
    """This process's folder, locked before it takes its final name (a sweep never sees it unlocked)."""
    root = tempfile.gettempdir()
    making = tempfile.mkdtemp(prefix="smdebug-staging-", dir=root)
    fd = os.open(os.path.join(making, _LOCK), os.O_CREAT | os.O_RDWR, 0o600)
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    path = os.path.join(root, PREFIX + os.path.basename(making)[len("smdebug-staging-") :])
    os.rename(making, path)
    atexit.register(_remove_if_empty, os.getpid(), path)
    return os.getpid(), path, fd


def _remove_if_empty(pid: int, path: str) -> None:
    """At exit: this process's folder goes unless files still wait in it (an upload close gave up on:
    recorded unsaved; the next process removes them)."""
    if os.getpid() != pid:  # a forked child exiting: the folder is its parent's
        return
    try:
        if not any(_held(path)):
            shutil.rmtree(path)
    except OSError:
        pass


def sweep() -> None:
    """Remove the folders left in the system temp dir by processes that are gone (once per process and
    temp dir), with one warning naming what they held."""
    root = tempfile.gettempdir()
    with _lock:
        if root in _swept or fcntl is None:
            return
        _swept.add(root)
        own = _folder[1] if _folder is not None else None
    try:
        names = [n for n in os.listdir(root) if n.startswith(PREFIX)]
    except OSError:
        return
    loose = []
    for name in names:
        path = os.path.join(root, name)
        if path != own:
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    loose.append(path)
                else:
                    _remove_if_left(path)
            except OSError as exc:  # another user's, or going away meanwhile
                logger.debug("smdebug: left %s: %s", path, exc)
    if loose:
        _remove_loose(loose)


def _remove_loose(paths: list[str]) -> None:
    """Remove the loose staged files of older versions whose process is surely gone."""
    try:
        processes = _processes()
    except OSError:  # no /proc: no process is known to be gone
        return
    removed = []
    for path in paths:
        try:
            info = os.lstat(path)
            if info.st_uid != os.getuid() or (info.st_dev, info.st_ino) in processes.open_files:
                continue
            # its writer started before it wrote the file: any such Python process may still be it
            if any(uid == info.st_uid and start <= info.st_mtime for uid, start in processes.pythons):
                continue
            os.unlink(path)
            removed.append(info.st_size)
        except OSError as exc:
            logger.debug("smdebug: left %s: %s", path, exc)
    if removed:
        logger.warning(
            "smdebug: removed %d file(s) (%d bytes) an older smdebug left in %s (smdebug-staged-*) while "
            "they waited for the store: their steps are not in their runs",
            len(removed),
            sum(removed),
            tempfile.gettempdir(),
        )


class _Processes:
    def __init__(self) -> None:
        self.open_files: set[tuple[int, int]] = set()  # (device, inode) of the files open in processes
        self.pythons: list[tuple[int, float]] = []  # (uid, start time) of each process that may be Python


def _processes() -> _Processes:
    """What /proc says of the living processes (raises OSError without it)."""
    found = _Processes()
    with open("/proc/stat", encoding="ascii") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in (n for n in os.listdir("/proc") if n.isdigit()):
        base = f"/proc/{pid}"
        try:
            uid = os.stat(base).st_uid
            with open(f"{base}/stat", encoding="ascii", errors="replace") as f:
                started = boot + int(f.read().rsplit(")", 1)[1].split()[19]) / ticks
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if _may_be_python(base):
            found.pythons.append((uid, started))
        try:
            for fd in os.listdir(f"{base}/fd"):
                try:
                    opened = os.stat(f"{base}/fd/{fd}")
                    found.open_files.add((opened.st_dev, opened.st_ino))
                except OSError:
                    pass
        except OSError:  # another user's: its Python processes count by their start time alone
            pass
    return found


def _may_be_python(base: str) -> bool:
    """Whether a process may run Python: its program is a python, or it maps libpython; one we cannot
    look into may be."""
    try:
        if "python" in os.path.basename(os.readlink(f"{base}/exe")):
            return True
        with open(f"{base}/maps", encoding="ascii", errors="replace") as f:
            return any("libpython" in line for line in f)
    except FileNotFoundError:  # no program: a kernel thread, or a process that has just ended
        return False
    except OSError:
        return True


def _remove_if_left(path: str) -> None:
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return
    fd = os.open(os.path.join(path, _LOCK), os.O_RDONLY | os.O_NOFOLLOW)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # its process is alive
        held = _held(path)
        shutil.rmtree(path)
    finally:
        os.close(fd)
    for uri, steps, files in held:
        logger.warning(
            "smdebug: removed %d file(s) of %s left in %s by a process that ended while they waited for "
            "the store%s: they are not in the run",
            files,
            uri,
            path,
            f" (steps {min(steps)} to {max(steps)}, {len(steps)} step(s))" if steps else "",
        )


def _held(path: str) -> list[tuple[str, list[int], int]]:
    """(run URI, steps, number of files) of each run a left folder holds files of."""
    held = []
    for sub in sorted(os.listdir(path)):
        folder = os.path.join(path, sub)
        if not os.path.isdir(folder) or os.path.islink(folder):
            continue
        files = [n for n in os.listdir(folder) if n != _RUN]
        if not files:
            continue
        try:
            with open(os.path.join(folder, _RUN), encoding="utf-8", errors="replace") as f:
                uri = f.read(4096)
        except OSError:
            uri = "a run"
        steps = sorted({int(n[:12]) for n in files if n[:12].isdigit()})
        held.append((uri, steps, len(files)))
    return held
