"""The contracts a third party implements without subclassing the core's classes.

``Store``: what ``smdebug_open_store`` returns, the storage of one run. The core's implementation is
``smdebug.store.Store`` (any fsspec URI); a plugin may return any object with these members. The
run's writer contract, ``Writer``, lives with the writers (``smdebug.writing``).

Paths given to a store are relative to the run's root, made by smdebug from step numbers and worker
names (never from tensor names), and use ``/``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, BinaryIO, Protocol, runtime_checkable

if TYPE_CHECKING:
    import fsspec


@runtime_checkable
class StagedFile(Protocol):
    """A file written piece by piece and published whole by ``commit``."""

    size: int  # bytes written so far

    def write(self, data: bytes) -> None: ...

    def commit(self) -> None:
        """Publish the file whole; readers never see a part of it. May be called again after it raised."""

    def resume(self) -> None:
        """Write on after a failed ``commit``."""

    def discard(self) -> None:
        """Drop the file; nothing is published."""

    @property
    def in_memory(self) -> int:
        """Bytes this file holds in memory (the writer bounds them; 0 when it holds none)."""

    def spill(self) -> None:
        """Move what it holds in memory elsewhere (a local temp file), to keep memory bounded."""


@runtime_checkable
class Store(Protocol):
    """Reads and writes the files of one run under ``root``."""

    uri: str  # the run's location as given, credentials masked (for messages)
    root: str  # the run's root path as ``fs`` names it
    is_local: bool  # a local folder (writes are renames; the writer may run in a process of its own)

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """An fsspec filesystem that lists and checks the run's folders (the CLI and run discovery)."""

    def path(self, relpath: str) -> str:
        """The full path of a file of the run, as ``fs`` names it."""

    def relative(self, path: str) -> str:
        """The inverse of ``path``."""

    def describe(self, exc: BaseException) -> str:
        """``Type: message`` of an error, with any credential masked."""

    # -- writing (a whole file appears at once to readers) ---------------------------------------------
    def write_bytes(self, relpath: str, data: bytes) -> None: ...

    def create_exclusive(self, relpath: str, data: bytes) -> None:
        """Create a file that must not exist yet: FileExistsError when it does (the worker's claim)."""

    def remove(self, relpath: str) -> None: ...

    def stage(self, relpath: str) -> StagedFile:
        """A file written piece by piece, published whole by its ``commit``."""

    def open_write(self, relpath: str) -> BinaryIO:
        """A file object written in place (TensorBoard's event files, which readers follow as they grow)."""

    # -- reading -------------------------------------------------------------------------------------
    def read_bytes(self, relpath: str, start: int | None = None, end: int | None = None) -> bytes:
        """A file's bytes, or ``[start, end)`` of them; FileNotFoundError when it does not exist."""

    def read_many(self, relpaths: Iterable[str]) -> dict[str, bytes]:
        """Several whole files at once (concurrently where the storage allows); missing ones are left out."""

    def read_ranges(self, relpath_ranges: list[tuple[str, int, int]]) -> list[bytes | BaseException]:
        """The ``[start, end)`` bytes of each ``(relpath, start, end)``, in order (fewer past a file's end);
        the exception in place of a range that could not be read."""

    def exists(self, relpath: str) -> bool: ...

    def list(self, relprefix: str) -> list[str]:
        """Every file under a folder of the run (recursively), as sorted paths relative to the root."""

    def list_dirs(self, relprefix: str) -> list[str]:
        """The immediate subfolders of a folder of the run, as sorted paths relative to the root."""
