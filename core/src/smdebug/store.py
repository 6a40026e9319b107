"""Storage of a run's files through fsspec, so any URI works (local paths, s3://, memory://, ...).

Paths handed to a Store are relative to the run's root and are built by smdebug from step numbers and
worker names only, never from tensor names; ``_relpath`` still refuses anything that could escape.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable

import fsspec


class Store:
    """Reads and writes the files of one run under ``root``."""

    def __init__(self, root: str, fs: fsspec.AbstractFileSystem | None = None):
        if fs is None:
            fs, path = fsspec.core.url_to_fs(root)
        else:
            path = fs._strip_protocol(root)
        self.uri = root
        self.fs = fs
        self.root = path.rstrip("/") or "/"
        self.is_local = "file" in _protocols(fs)

    # -- paths --------------------------------------------------------------------------------------
    def path(self, relpath: str) -> str:
        return f"{self.root}/{_relpath(relpath)}"

    def relative(self, path: str) -> str:
        return path[len(self.root) + 1 :] if path.startswith(self.root + "/") else path

    # -- writing ------------------------------------------------------------------------------------
    def write_bytes(self, relpath: str, data: bytes) -> None:
        """Write a whole file so that readers see either nothing or all of it."""
        path = self.path(relpath)
        if self.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        else:  # object stores publish an object atomically on PUT
            self.fs.pipe_file(path, data)

    def open_write(self, relpath: str):
        path = self.path(relpath)
        if self.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return open(path, "wb")
        return self.fs.open(path, "wb")

    # -- reading ------------------------------------------------------------------------------------
    def read_bytes(self, relpath: str, start: int | None = None, end: int | None = None) -> bytes:
        path = self.path(relpath)
        if self.is_local:
            with open(path, "rb") as f:
                if start:
                    f.seek(start)
                return f.read() if end is None else f.read(end - (start or 0))
        return self.fs.cat_file(path, start=start, end=end)

    def read_many(self, relpaths: Iterable[str]) -> dict[str, bytes]:
        """Fetch several whole files; remote filesystems fetch them concurrently."""
        relpaths = list(relpaths)
        if self.is_local:
            return {p: self.read_bytes(p) for p in relpaths}
        fetched = self.fs.cat([self.path(p) for p in relpaths], on_error="omit")
        return {self.relative(self.fs._strip_protocol(k)): v for k, v in fetched.items()}

    def read_ranges(self, relpath_ranges: list[tuple[str, int, int]]) -> list[bytes]:
        """Fetch byte ranges [start, end) of files; remote filesystems fetch them concurrently."""
        if self.is_local:
            out = []
            handles: dict[str, object] = {}
            try:
                for rel, start, end in relpath_ranges:
                    f = handles.get(rel) or handles.setdefault(rel, open(self.path(rel), "rb"))
                    f.seek(start)
                    out.append(f.read(end - start))
            finally:
                for f in handles.values():
                    f.close()
            return out
        paths = [self.path(r) for r, _, _ in relpath_ranges]
        return self.fs.cat_ranges(paths, [s for _, s, _ in relpath_ranges], [e for _, _, e in relpath_ranges])

    def exists(self, relpath: str) -> bool:
        return self.fs.exists(self.path(relpath))

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
                found = self.fs.find(base)
            except FileNotFoundError:
                found = []
        return sorted(self.relative(p) for p in found if ".tmp-" not in p)


def _protocols(fs) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _relpath(relpath: str) -> str:
    parts = relpath.split("/")
    if relpath.startswith("/") or "\0" in relpath or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"refusing unsafe path {relpath!r} inside the output location")
    return relpath
