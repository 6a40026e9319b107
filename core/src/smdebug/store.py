"""Storage of a run's files through fsspec, so any URI works (local paths, s3://, memory://, ...).

Paths handed to a Store are relative to the run's root and are built by smdebug from step numbers and
worker names only, never from tensor names; ``_relpath`` still refuses anything that could escape.

S3 goes through s3fs, configured the standard ways: the AWS environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_MAX_ATTEMPTS``, ...), fsspec's (``FSSPEC_S3_ENDPOINT_URL``...), or
``storage_options``. Error messages go through ``redact`` so that credentials never reach a log.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from smdebug import staging
from smdebug.env import env_number
from smdebug.exceptions import CorruptRunError
from smdebug.layout import is_inside_run

if TYPE_CHECKING:
    import fsspec

    from smdebug.types import Store as StoreProtocol

# A step staged for a remote store stays in memory up to this size (and the writer's bound), then goes to
# a local temp file.
SPOOL_BYTES = 8 * 1024 * 1024
# Files up to this size are uploaded with one PUT (retryable as a whole); larger ones are streamed.
SINGLE_PUT_BYTES = 64 * 1024 * 1024
READ_BATCH = 64  # concurrent requests of one batched read
READ_ATTEMPTS = 4  # a remote read that fails (other than "not found") is tried this many times
# How long a reader (a remote Trial, the CLI) waits for a remote store's first answer (seconds).
REACH_TIMEOUT_ENV = "SMDEBUG_CLI_REACH_TIMEOUT"
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ACCESS_KEY_ID")
_SECRET_OPTIONS = (
    "secret",
    "token",
    "key",
    "aws_secret_access_key",
    "aws_session_token",
    "aws_access_key_id",
)
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_DOUBLED_SLASHES = re.compile(r"/{2,}")


def reach_timeout() -> float:
    """The seconds a reader waits for a remote store's first answer: $SMDEBUG_CLI_REACH_TIMEOUT, else 20."""
    return env_number(REACH_TIMEOUT_ENV, 20.0, positive=True)


# How long one remote read (a listing, a batch of files or ranges) may take before it is given up
# (seconds), plus a second per READ_RATE bytes asked for: an endpoint that stops answering mid-read, or
# answers a byte at a time, must not hang a reader.
READ_TIMEOUT_ENV = "SMDEBUG_READ_TIMEOUT"
READ_RATE = 1024 * 1024


def read_timeout(nbytes: int = 0) -> float:
    """The seconds one remote read of ``nbytes`` may take: $SMDEBUG_READ_TIMEOUT (default 60) plus a
    second per MiB."""
    return env_number(READ_TIMEOUT_ENV, 60.0, positive=True) + nbytes / READ_RATE


class Store:
    """Reads and writes the files of one run under ``root``."""

    def __init__(self, root: str, fs: fsspec.AbstractFileSystem | None = None, **storage_options):
        if fs is None and not storage_options and _is_plain_local(root):
            # a local folder needs no fsspec (its import is most of the time to open a small run)
            self.uri = redact(root)
            self._fs = None
            self.root = _local_root(root).rstrip("/") or "/"
            self.is_local = True
            self._bounded = False
            self._secrets = []
            self._inside: dict[str, bool] = {}
            self._root_real: str | None = None
            self._folders: set[str] = set()
            return
        import fsspec
        from fsspec.asyn import AsyncFileSystem

        if fs is None:
            protocol = fsspec.core.split_protocol(root)[0]
            if protocol not in (None, "file", "local", "memory"):
                # Another process adds files all the time: a cached listing would hide them (s3fs even
                # answers "not found" for a file missing from a cached listing of its folder).
                storage_options.setdefault("use_listings_cache", False)
            try:
                try:
                    fs, path = fsspec.core.url_to_fs(root, **storage_options)
                except TypeError:  # a filesystem without that option
                    storage_options.pop("use_listings_cache", None)
                    fs, path = fsspec.core.url_to_fs(root, **storage_options)
            except ImportError as exc:  # the filesystem's package (s3fs for s3://) is not installed
                from smdebug._optional import MissingDependencyError, install_hint

                package = "s3fs" if protocol in ("s3", "s3a") else getattr(exc, "name", None)
                hint = f": {install_hint(package)}" if package else ""
                raise MissingDependencyError(
                    f"{redact(root)}: {protocol}:// needs {package or 'a filesystem package'}, "
                    f"which is not installed{hint}"
                ) from None
        else:
            path = fs._strip_protocol(root)
        self.uri = redact(root)
        self._fs = fs
        self.is_local = "file" in _protocols(fs)
        # fsspec's async filesystems (s3, gcs, http...) take a deadline per call and cancel the call
        # at it; a read from another filesystem waits for its client's own timeouts
        self._bounded = not self.is_local and isinstance(fs, AsyncFileSystem)
        if not self.is_local:
            # an object store cannot list a key with an empty folder name (``bucket/a//run``): one slash
            path = _DOUBLED_SLASHES.sub("/", path)
        self.root = path.rstrip("/") or "/"
        self._secrets = _secrets_of(fs)
        self._inside = {}
        self._root_real = None
        self._folders = set()

    def __repr__(self):
        return f"<Store {self.uri}>"

    @staticmethod
    def is_plain_local(uri: str) -> bool:
        """Whether ``uri`` is a local folder that this class writes without fsspec."""
        return _is_plain_local(uri)

    @staticmethod
    def place(uri: str) -> str:
        """Where a run at ``uri`` is, to compare two out_dirs: a local folder's real path, any other URI
        as it is."""
        return os.path.realpath(_local_root(uri)) if _is_plain_local(uri) else uri

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem (a local store makes it on first use)."""
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem("file")
        return self._fs

    # -- paths --------------------------------------------------------------------------------------
    def path(self, relpath: str) -> str:
        return f"{self.root}/{_relpath(relpath)}"

    def relative(self, path: str) -> str:
        return path[len(self.root) + 1 :] if path.startswith(self.root + "/") else path

    def describe(self, exc: BaseException) -> str:
        """``Type: message`` of an error, with any credential masked."""
        return redact(f"{type(exc).__name__}: {exc}", self._secrets)

    # -- writing ------------------------------------------------------------------------------------
    def write_bytes(self, relpath: str, data: bytes) -> None:
        """Write a whole file so that readers see either nothing or all of it."""
        path = self.path(relpath)
        if self.is_local:
            tmp = _temp_name(path)
            try:
                fd = self._create(tmp)
                try:
                    _write_all(fd, data)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            except BaseException:
                _unlink(tmp)
                raise
        else:  # object stores publish an object atomically on PUT
            self.fs.pipe_file(path, data)

    def create_exclusive(self, relpath: str, data: bytes) -> None:
        """Create a file that must not exist yet; FileExistsError when it does. Atomic locally (O_EXCL)
        and on S3 (a conditional PUT, If-None-Match: "*"); other filesystems look, then write."""
        path = self.path(relpath)
        if self.is_local:
            self._folder(os.path.dirname(path))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except BaseException:  # an empty claim would hold the name for nobody
                _unlink(path)
                raise
            return
        try:
            self.fs.pipe_file(path, data, mode="create")
        except TypeError:  # a filesystem whose pipe_file has no mode
            self.fs.invalidate_cache(path)
            if self.fs.exists(path):
                raise FileExistsError(path) from None
            self.fs.pipe_file(path, data)

    def remove(self, relpath: str) -> None:
        path = self.path(relpath)
        if self.is_local:
            _unlink(path)
        else:
            self.fs.rm_file(path)

    def remove_left_temp_files(self, owned: Callable[[str], bool]) -> list[str]:
        """Remove the temp files (``<file>.tmp-...``) a local writer that is gone left beside the files
        ``owned(file name)`` says were its own, never this process's; the files they were for (relative
        paths). Only its caller can know the writer is gone (a restarted job taking over its worker)."""
        if not self.is_local:
            return []  # objects are published whole: no temp file
        mine = f"{TEMP_MARK}{_TEMP_TOKEN}{os.getpid()}-"
        removed = []
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                target, mark, _ = name.partition(TEMP_MARK)
                if mark and target and not name.startswith(target + mine) and owned(target):
                    _unlink(os.path.join(dirpath, name))
                    removed.append(self.relative(os.path.join(dirpath, target)))
        return sorted(removed)

    def stage(self, relpath: str) -> StagedFile:
        """A file written piece by piece and published whole by ``commit()`` (which may be retried)."""
        return StagedFile(self, relpath)

    def open_write(self, relpath: str):
        path = self.path(relpath)
        if self.is_local:
            self._folder(os.path.dirname(path))
            return open(path, "wb")
        return self.fs.open(path, "wb")

    # -- reading ------------------------------------------------------------------------------------
    def _read(self, call, *args, nbytes: int = 0, **kwargs):
        """A read of the remote filesystem, given up after read_timeout(nbytes) seconds (StoreTimeoutError
        naming the store) when its filesystem takes a deadline. A store that does not answer, or answers
        with a failure, raises StoreUnavailableError (an OSError) naming it and the cause; "not found"
        stays a FileNotFoundError."""
        timeout = read_timeout(nbytes) if self._bounded else None
        try:
            return call(*args, **kwargs) if timeout is None else call(*args, timeout=timeout, **kwargs)
        except Exception as exc:
            failure = self._failure(exc, timeout)
            if failure is None:
                raise
            raise failure from exc

    def _failure(self, exc: Exception, timeout: float | None) -> Exception | None:
        """What a remote read's error becomes for smdebug's callers (None: raised as it is). The storage
        clients' own errors (botocore's, aiohttp's) are no OSError: a caller handling an outage would miss
        them."""
        if self.is_local or isinstance(exc, (StoreUnavailableError, *_AS_RAISED)):
            return None
        if timeout is not None:
            from fsspec.exceptions import FSTimeoutError

            if isinstance(exc, FSTimeoutError):
                return StoreTimeoutError(
                    f"{self.uri} did not answer within {timeout:g} s ({READ_TIMEOUT_ENV})"
                )
        if _not_found(exc):
            return FileNotFoundError(f"{self.uri}: {self.describe(exc)}")
        if isinstance(exc, (OSError, *_client_errors())):
            return StoreUnavailableError(f"{self.uri} did not answer: {self.describe(exc)}")
        return None

    def ask(self, call, *args, **kwargs):
        """``call(*args)`` of the store's filesystem (``fs.exists``, ``fs.glob``, ...), given up after the
        read timeout as every read of the store is (TimeoutError naming it)."""
        return self._read(call, *args, **kwargs)

    def read_bytes(self, relpath: str, start: int | None = None, end: int | None = None) -> bytes:
        path = self.path(relpath)
        if self.is_local:
            fd, size = self.open_regular(path)
            try:
                return read_at(fd, start or 0, size if end is None else min(end, size))
            finally:
                os.close(fd)
        size = end - (start or 0) if end is not None and end >= 0 and (start or 0) >= 0 else 0
        return self._read(self.fs.cat_file, path, start=start, end=end, nbytes=size)

    def read_many(self, relpaths: Iterable[str]) -> dict[str, bytes]:
        """Fetch several whole files; remote filesystems fetch them concurrently. Missing ones are left out."""
        relpaths = list(relpaths)
        if self.is_local:
            out = {}
            for p in relpaths:
                try:
                    out[p] = self.read_bytes(p)
                except FileNotFoundError:
                    pass
            return out
        if not relpaths:
            return {}
        out: dict[str, bytes] = {}
        todo = relpaths
        for attempt in range(READ_ATTEMPTS):
            # exact paths (fs.cat would expand a prefix's "[1]" as a glob); start=0: one ranged GET per file
            # (s3fs would otherwise ask for each file's size first)
            paths = [self.path(p) for p in todo]
            fetched = self._cat_ranges(paths, [0] * len(paths), [None] * len(paths), 0)
            failed = []
            for rel, value in zip(todo, fetched):
                if not isinstance(value, BaseException):
                    out[rel] = value
                elif not isinstance(value, FileNotFoundError) and not _not_found(value):
                    failed.append((rel, value))  # a busy or flaky server: ask again
            if not failed:
                break
            todo = [rel for rel, _ in failed]
            if attempt == READ_ATTEMPTS - 1:
                raise StoreUnavailableError(
                    f"could not read {len(failed)} file(s) of {self.uri}, e.g. {todo[0]}: "
                    f"{self.describe(failed[0][1])}"
                )
            time.sleep(0.2 * 2**attempt)
        return out

    def _cat_ranges(self, paths: list[str], starts: list, ends: list, nbytes: int) -> list:
        """fs.cat_ranges of exact paths, concurrently in batches: bytes, or the exception, per path."""
        try:
            return self._read(
                self.fs.cat_ranges,
                paths,
                starts,
                ends,
                on_error="return",
                batch_size=READ_BATCH,
                nbytes=nbytes,
            )
        except TypeError:  # a filesystem whose cat_ranges takes neither
            return self._read(self.fs.cat_ranges, paths, starts, ends, nbytes=nbytes)

    def read_ranges(self, relpath_ranges: list[tuple[str, int, int]]) -> list[bytes | BaseException]:
        """Fetch byte ranges [start, end) of files; remote filesystems fetch them concurrently.

        A range that cannot be read gives its exception in place of bytes; a range past the end of a
        file gives the bytes there are (fewer than asked).
        """
        if self.is_local:
            out: list[bytes | BaseException] = []
            handles: dict[str, tuple[int, int]] = {}
            try:
                for rel, start, end in relpath_ranges:
                    try:
                        if rel not in handles:
                            handles[rel] = self.open_regular(self.path(rel))
                        fd, size = handles[rel]
                        out.append(read_at(fd, start, min(end, size)))  # never more than the file holds
                    except (OSError, ValueError, CorruptRunError) as exc:
                        out.append(exc)
            finally:
                for fd, _ in handles.values():
                    os.close(fd)
            return out
        if not relpath_ranges:
            return []
        out: list[bytes | BaseException] = [OSError("not read")] * len(relpath_ranges)
        todo = list(range(len(relpath_ranges)))
        for attempt in range(READ_ATTEMPTS):
            paths = [self.path(relpath_ranges[i][0]) for i in todo]
            starts = [relpath_ranges[i][1] for i in todo]
            ends = [relpath_ranges[i][2] for i in todo]
            nbytes = sum(max(0, e - b) for b, e in zip(starts, ends))
            try:
                got = self._cat_ranges(paths, starts, ends, nbytes)
            except TimeoutError as exc:  # no answer: asking again would wait as long again
                for i in todo:
                    out[i] = exc
                break
            retry = []
            for i, value in zip(todo, got):
                out[i] = value
                if isinstance(value, BaseException) and is_transient(value):
                    retry.append(i)
            if not retry or attempt == READ_ATTEMPTS - 1:
                break
            todo = retry
            time.sleep(0.2 * 2**attempt)
        return out

    def open_regular(self, path: str) -> tuple[int, int]:
        """(file descriptor, size) of a local file of the run, opened for reading. A run's bytes are
        untrusted: a FIFO, a device or a link leading out of the run raises CorruptRunError naming the
        file (checked before opening: opening a FIFO would wait for a writer)."""
        if not self._is_inside(os.path.dirname(path)):
            raise CorruptRunError(f"{path}: its folder leads out of the run; not read")
        info = os.lstat(path)  # looked at before opening: opening a FIFO waits, a device may act
        if stat.S_ISLNK(info.st_mode):
            if not self._is_inside(os.path.realpath(path), resolved=True):
                raise CorruptRunError(f"{path}: a link leading out of the run; not read")
            info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptRunError(f"{path}: not a regular file; not read")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # swapped since the check
            os.close(fd)
            raise CorruptRunError(f"{path}: not a regular file; not read")
        return fd, info.st_size

    def _is_inside(self, path: str, resolved: bool = False) -> bool:
        """Whether a local path (a folder, or a resolved file) lies inside the run's real folder. A folder
        below the root is inside when its parent is and it is no link leading out: one lstat a new folder
        (a run has a folder a step), not a realpath of the whole chain."""
        if resolved:
            root = self._real_root()
            return path == root or path.startswith(root.rstrip("/") + "/")
        known = self._inside.get(path)
        if known is None:
            parent = os.path.dirname(path)
            if path == self.root:
                known = True
            elif parent != path and path.startswith(self.root + "/") and "/.." not in path[len(self.root) :]:
                known = self._is_inside(parent) and (
                    not os.path.islink(path) or self._is_inside(os.path.realpath(path), resolved=True)
                )
            else:
                known = self._is_inside(os.path.realpath(path), resolved=True)
            if len(self._inside) >= 1024:  # each step has a folder: a long run would keep them all
                self._inside.clear()
            self._inside[path] = known
        return known

    def _real_root(self) -> str:
        if self._root_real is None:
            self._root_real = os.path.realpath(self.root)
        return self._root_real

    def _folder(self, folder: str) -> None:
        """Make a local folder of the run if it is missing. The writer writes nothing through a link
        inside the run that leads out of it. A folder is checked once, then remembered: a step's event
        file goes to a new folder (one mkdir), the rest to a few."""
        if folder in self._folders:
            return
        out = f"{folder} leads out of the output location (a symbolic link); not written"
        if folder != self.root and not self._is_inside(os.path.dirname(folder)):
            raise OSError(out)
        try:
            os.mkdir(folder)  # made here: a plain folder, inside the run as its parent is
        except FileExistsError:  # (another worker's, an earlier run's, or a link)
            if not self._is_inside(folder):
                raise OSError(out) from None
        except (FileNotFoundError, NotADirectoryError):  # its parent is missing too (a new run's first file)
            os.makedirs(folder, exist_ok=True)  # (or says which part of the path is no folder)
            if not self._is_inside(folder):
                raise OSError(out) from None
        if len(self._folders) >= 1024:  # each step has a folder: a long run would keep them all
            self._folders.clear()
        self._folders.add(folder)

    def _create(self, path: str) -> int:
        """A new local file of the run, opened for writing (a descriptor): its folder made if missing.
        Direct system calls: open() would add a status call, a seek and a terminal check a file."""
        self._folder(os.path.dirname(path))
        try:
            return os.open(path, _CREATE, 0o666)
        except FileNotFoundError:  # its remembered folder was removed since: made again
            self._folders.discard(os.path.dirname(path))
            self._folder(os.path.dirname(path))
            return os.open(path, _CREATE, 0o666)

    def exists(self, relpath: str) -> bool:
        path = self.path(relpath)
        if self.is_local:
            return os.path.exists(path)
        self.fs.invalidate_cache(path)  # another process may have written it since we last listed
        try:
            return self._read(self.fs.exists, path)
        except FileNotFoundError:  # (a "not found" the filesystem raised rather than answered)
            return False

    def list(self, relprefix: str) -> list[str]:
        """Every file under relprefix (recursively), as sorted paths relative to the root."""
        base = self.path(relprefix)
        if self.is_local:
            found = []
            for dirpath, _, files in os.walk(base):
                found.extend(os.path.join(dirpath, f) for f in files)
        else:
            self.fs.invalidate_cache(base)
            try:
                found = self._read(self.fs.find, base)
            except FileNotFoundError:
                found = []
        return sorted(self.relative(p) for p in found if TEMP_MARK not in p)

    def list_dirs(self, relprefix: str) -> list[str]:
        """The immediate subfolders of relprefix, as sorted paths relative to the root."""
        base = self.path(relprefix)
        if self.is_local:
            try:
                names = [e.name for e in os.scandir(base) if e.is_dir()]
            except FileNotFoundError:
                return []
            return sorted(f"{relprefix}/{n}" for n in names)
        self.fs.invalidate_cache(base)
        try:
            entries = self._read(self.fs.ls, base, detail=True)
        except FileNotFoundError:
            return []
        return sorted(self.relative(e["name"].rstrip("/")) for e in entries if e.get("type") == "directory")


class StoreUnavailableError(ConnectionError):
    """A remote store that did not answer, or answered with a failure (an outage, a busy server): no
    damage to the run, and the same read may work once the store is back."""


class StoreTimeoutError(StoreUnavailableError, TimeoutError):
    """A remote read given up after SMDEBUG_READ_TIMEOUT (an endpoint that stopped answering)."""


# errors of a remote read raised as they are: what the store answered (nothing there, no access), or a
# caller's mistake
_AS_RAISED = (
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    ValueError,
    TypeError,
    NotImplementedError,
    CorruptRunError,
)
_NOT_FOUND_CODES = ("404", "NoSuchKey", "NoSuchBucket", "NotFound")


@functools.cache
def _client_errors() -> tuple[type[BaseException], ...]:
    """The storage clients' errors that are no OSError (botocore's, aiohttp's), those installed."""
    found: list[type[BaseException]] = []
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        found += [BotoCoreError, ClientError]
    except ImportError:
        pass
    try:
        from aiohttp import ClientError as HTTPClientError

        found.append(HTTPClientError)
    except ImportError:
        pass
    return tuple(found)


def _not_found(exc: BaseException) -> bool:
    """Whether a storage client's error (a botocore ClientError s3fs did not translate) says "not found"."""
    response = getattr(exc, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return str(code) in _NOT_FOUND_CODES


TEMP_MARK = ".tmp-"  # a file being written locally: <file>.tmp-<token><pid>-<n>, renamed when whole
_TEMP_TOKEN = uuid.uuid4().hex[:8]  # with the pid: temp names of this process, unique on a shared folder
_temp_numbers = itertools.count()


_pid = [os.getpid()]  # kept up to date in a forked child, without a system call per file
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)  # open(path, "wb")
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)  # open(path, "ab")
LOCAL_BUFFER = 64 * 1024  # a local staged file's small writes are joined up to this size


def _temp_name(path: str) -> str:
    return f"{path}{TEMP_MARK}{_TEMP_TOKEN}{_pid[0]}-{next(_temp_numbers)}"


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    view = view.cast("B") if view.nbytes else b""  # (an empty array's view cannot be cast)
    while view:
        view = view[os.write(fd, view) :]


def read_at(fd: int, start: int, end: int) -> bytes:
    """Bytes [start, end) of an open file (fewer at its end); end is at most the file's size."""
    if end <= start:
        return b""
    chunks, pos = [], start
    while pos < end:
        chunk = os.pread(fd, min(end - pos, 1 << 30), pos)
        if not chunk:
            break
        chunks.append(chunk)
        pos += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class StagedFile:
    """One file being written: locally a temp file beside its destination, remotely a buffer in memory
    (a local temp file once ``spill`` is called or it passes SPOOL_BYTES).

    ``commit`` publishes it whole (rename, or upload); if an upload fails, ``commit`` can be called again.
    """

    def __init__(self, store: Store, relpath: str):
        self.store = store
        self.relpath = relpath
        self.size = 0
        self._buf: bytearray | None = None  # a remote file's bytes while in memory
        self._spilled: str | None = None  # then a local temp file's path (open only while written)
        self._file = None  # (the spilled file, while written)
        path = store.path(relpath)
        if store.is_local:
            self._tmp = _temp_name(path)
            self._fd: int | None = store._create(self._tmp)
            self._pending = bytearray()  # small writes, joined into one system call
        else:
            self._tmp = None
            self._buf = bytearray()
            staging.sweep()  # (once a process) what killed processes left waiting on this machine

    def write(self, data) -> None:
        n = memoryview(data).nbytes
        if self._tmp is not None:
            if len(self._pending) + n > LOCAL_BUFFER:
                self._drain()
                if n >= LOCAL_BUFFER:  # a large one as it is: no copy of it
                    _write_all(self._fd, data)
                    self.size += n
                    return
            self._pending.extend(data)  # (+= would be numpy's addition of an array)
            self.size += n
            return
        if self._buf is not None and len(self._buf) + n > SPOOL_BYTES:
            self.spill()  # before the bytes are added: memory never holds more than SPOOL_BYTES
        if self._buf is not None:
            self._buf += data
        else:
            if self._file is None:  # a spilled remote file, written on
                self._file = open(self._spilled, "ab")
            self._file.write(data)
        self.size += n

    def _drain(self) -> None:
        if self._pending:
            _write_all(self._fd, self._pending)
            self._pending = bytearray()

    def resume(self) -> None:
        """Write on after ``seal`` or a failed ``commit`` (which may have read the buffer)."""
        if self._tmp is not None and self._fd is None:
            self._fd = os.open(self._tmp, _APPEND, 0o666)

    def seal(self) -> None:
        """Written whole: a local temp file is closed (a step waiting to be published holds no buffer
        nor file descriptor)."""
        if self._tmp is not None:
            self._close_local()
        elif self._file is not None:  # a spilled remote file: no descriptor held while it waits
            self._file.close()
            self._file = None

    def _close_local(self) -> None:
        if self._fd is not None:
            try:
                self._drain()
            finally:
                fd, self._fd = self._fd, None
                os.close(fd)

    @property
    def in_memory(self) -> int:
        """Bytes this file holds in memory (0 once spilled to disk)."""
        if self._tmp is not None:
            return len(self._pending)
        return 0 if self._buf is None else len(self._buf)

    def spill(self) -> None:
        """Move a remote file's buffer to a local temp file, to keep memory bounded while it waits."""
        if self._buf is not None:
            # a named file, closed while it waits: a long outage's thousands of waiting steps hold no
            # file descriptor each
            fd, self._spilled = staging.spill_file(self.store.uri, self.relpath)
            with os.fdopen(fd, "wb") as f:
                f.write(self._buf)
            self._buf = None

    def commit(self) -> None:
        path = self.store.path(self.relpath)
        if self._tmp is not None:
            self._close_local()
            os.replace(self._tmp, path)
            self._tmp = None
            return
        fs = self.store.fs
        if self._buf is not None:  # handed over as it is: the client's copy is the only one made
            fs.pipe_file(path, self._buf)
            self._buf = None
            return
        if self._file is not None:
            self._file.close()
            self._file = None
        with open(self._spilled, "rb") as f:
            if self.size <= SINGLE_PUT_BYTES:
                fs.pipe_file(path, f.read())
            else:
                with fs.open(path, "wb") as out:
                    while chunk := f.read(8 * 1024 * 1024):
                        out.write(chunk)
        _unlink(self._spilled)
        self._spilled = None

    def discard(self) -> None:
        self._buf = None
        try:
            if self._file is not None:
                self._file.close()
        except OSError:  # its buffered bytes could not be written (a full disk): they are not wanted
            pass
        finally:
            if self._tmp is not None:
                self._pending = bytearray()
                if self._fd is not None:
                    fd, self._fd = self._fd, None
                    os.close(fd)
                _unlink(self._tmp)
            if self._spilled is not None:
                _unlink(self._spilled)
                self._spilled = None


def redact(text: str, extra_secrets: Iterable[str] = ()) -> str:
    """text with URL passwords and the credentials of the environment replaced by ***."""
    text = _URL_USERINFO.sub("***@", str(text))
    secrets = [os.environ.get(name) for name in _SECRET_ENV] + list(extra_secrets)
    for secret in secrets:
        if secret and len(secret) >= 8:  # short values would mask ordinary words
            text = text.replace(secret, "***")
    return text


def _secrets_of(fs) -> list[str]:
    found = []

    def walk(options):
        for k, v in (options or {}).items():
            if isinstance(v, dict):
                walk(v)
            elif isinstance(v, str) and k.lower() in _SECRET_OPTIONS:
                found.append(v)

    walk(getattr(fs, "storage_options", None))
    return found


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def is_transient(error: BaseException) -> bool:
    """Whether a remote read's error may go away on its own (the server is down or busy), unlike a file
    that is not there or a range past its end."""
    return not isinstance(error, (FileNotFoundError, ValueError))


def strip_trailing_slashes(uri: str) -> str:
    """``uri`` without trailing slashes, the ``://`` of a bare URI (``memory://``) and a root ``/`` kept."""
    stripped = uri.rstrip("/")
    return (
        uri[: len(stripped) + 2] if stripped.endswith(":") and uri[len(stripped) :] else stripped or uri[:1]
    )


def _is_plain_local(root: str) -> bool:
    return "::" not in root and ("://" not in root or root.startswith("file://"))


def _local_root(root: str) -> str:
    """The folder fsspec's local filesystem would make of ``root`` (user expanded, made absolute)."""
    path = os.path.expanduser(root[len("file://") :] if root.startswith("file://") else root)
    return path if os.path.isabs(path) else os.path.abspath(path)


def _protocols(fs) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _relpath(relpath: str) -> str:
    if not is_inside_run(relpath):
        raise ValueError(f"refusing unsafe path {relpath!r} inside the output location")
    return relpath


def probe(store: StoreProtocol, timeout: float) -> BaseException | None:
    """List a store's root once, off the calling thread and waiting at most ``timeout`` seconds: None when
    the store answered, else what it raised (FileNotFoundError: no such folder), or TimeoutError when it
    did not answer in time (an endpoint that hangs; the listing goes on in the background). Any store
    (``smdebug.types.Store``: a plugin's too) through its ``fs`` and ``root``."""
    outcome: list = []

    def listing():
        try:
            store.fs.ls(store.root, detail=False)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=listing, name="smdebug-store-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else TimeoutError(f"no answer within {timeout:g} s")
