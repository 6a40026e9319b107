"""Batched reading of saved records for a Trial.

A remote store (S3) costs one round trip per request, so asking for one value fetches, in one batch of
concurrent range reads, that value's event file and the event files of the following steps: whole files
when they are small (so the other tensors of those steps come along), else just the records of the same
tensor. The records land in a cache bounded in bytes; reading every value of a run then costs about one
request per event file. Local event files are read whole (when small) and kept in the same cache.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_left
from collections import OrderedDict

from smdebug.env import env_number
from smdebug.exceptions import CorruptRunError
from smdebug.store import read_at

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
WINDOW_FILES = 256  # event files fetched together on a miss
WINDOW_BYTES = 32 * 1024 * 1024  # bytes fetched together on a miss
WHOLE_FILE_BYTES = 4 * 1024 * 1024  # event files up to this size are fetched whole


def cache_bytes_from_env() -> int:
    return env_number("SMDEBUG_READ_CACHE_BYTES", DEFAULT_CACHE_BYTES, integer=True)


class EventFile:
    """What the index files say about one event file. The per-record tables are built when a remote
    read first needs them (a local trial only ever needs ``end``)."""

    __slots__ = ("step", "worker", "_entries", "_records", "_by_name", "end")

    def __init__(self, step: int, worker: str):
        self.step, self.worker = step, worker
        self._entries: list = []  # (name, start, length, ...) as the index gives them
        self._records: dict | None = None
        self._by_name: dict | None = None
        self.end = 0

    def add_entries(self, entries: list, keep: bool = True) -> None:
        """keep=False: only ``end`` is needed (a local file is read whole or by the caller's range)."""
        if entries:
            if keep:
                self._entries += entries
                self._records = self._by_name = None
            self.end = max(self.end, max(e[1] + e[2] for e in entries))

    def add(self, name: str, start: int, length: int) -> None:
        self.add_entries([(name, start, length)])

    @property
    def records(self) -> dict:
        """start offset -> (length, record name)"""
        if self._records is None:
            self._records = {e[1]: (e[2], e[0]) for e in self._entries}
        return self._records

    @property
    def by_name(self) -> dict:
        """record name -> start offset"""
        if self._by_name is None:
            self._by_name = {e[0]: e[1] for e in self._entries}
        return self._by_name


class RecordFetcher:
    def __init__(self, store, cache_bytes: int | None = None):
        self.store = store
        self.files: dict[str, EventFile] = {}
        self._order: list[tuple[int, str, str]] = []  # (step, worker, file), sorted
        self._cache: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._cached_bytes = 0
        self.cache_bytes = cache_bytes_from_env() if cache_bytes is None else cache_bytes
        self._lock = threading.RLock()
        self.requests = 0  # range reads issued (for the curious and for tests)

    def add(self, file: str, step: int, worker: str, name: str, start: int, length: int) -> None:
        self.add_file(file, step, worker, [(name, start, length)])

    def add_file(self, file: str, step: int, worker: str, entries: list) -> None:
        """The records an index file lists in one event file: (name, start, length, ...) each."""
        with self._lock:
            info = self.files.get(file)
            if info is None:
                info = self.files[file] = EventFile(step, worker)
                key = (step, worker, file)
                if not self._order or self._order[-1] < key:  # files come in step order: append
                    self._order.append(key)
                else:
                    self._order.insert(bisect_left(self._order, key), key)
            info.add_entries(entries, keep=not self.store.is_local)

    def locate(self, file: str, start: int, length: int) -> tuple[bytes | BaseException, int]:
        """(buffer, offset of the record in it): a local file's whole bytes when it is kept whole, else
        the record's own bytes (offset 0), or the error reading them."""
        if self.store.is_local:
            key = (file, -1)
            whole = self._cache.get(key)  # without the lock: a hit is one atomic lookup
            if whole is not None and start + length <= len(whole):
                try:
                    self._cache.move_to_end(key)
                except KeyError:  # evicted meanwhile by another thread: still the right bytes
                    pass
                return whole, start
            with self._lock:
                whole = self._cache.get(key)
                if whole is None:
                    data = self._get_local(file, start, length)  # reads the file whole when it can
                    if isinstance(data, BaseException):
                        return data, 0
                    whole = self._cache.get(key)
                    if whole is None or start + length > len(whole):
                        return data, 0
                elif start + length > len(whole):
                    return whole[start : start + length], 0
                else:
                    self._cache.move_to_end(key)
                return whole, start
        return self.get(file, start, length), 0

    def get(self, file: str, start: int, length: int) -> bytes | BaseException:
        """The bytes of one record (fewer when the file is truncated), or the error reading them."""
        if self.store.is_local:
            return self._get_local(file, start, length)
        with self._lock:
            cached = self._cache.get((file, start))
            if cached is not None:
                self._cache.move_to_end((file, start))
                return cached
            plan = self._plan(file, start, length)
            self.requests += len(plan)
            results = self.store.read_ranges(plan)
            wanted: bytes | BaseException = b""
            for (f, lo, hi), data in zip(plan, results):
                if isinstance(data, BaseException):
                    if f == file and lo <= start < hi:
                        wanted = data
                    continue
                for rec_start, (rec_len, _) in self.files[f].records.items():
                    if lo <= rec_start < hi:
                        rec = bytes(data[rec_start - lo : rec_start - lo + rec_len])
                        if f == file and rec_start == start:
                            wanted = rec
                        self._put((f, rec_start), rec)
            return wanted

    def _get_local(self, file: str, start: int, length: int) -> bytes | BaseException:
        """A local event file small enough is read whole once and kept (reading a tensor's values step
        after step then opens each file once, not once per value); a larger one record by record."""
        with self._lock:
            key = (file, -1)
            data = self._cache.get(key)
            if data is not None:
                self._cache.move_to_end(key)
            else:
                info = self.files.get(file)
                self.requests += 1
                if info is None or info.end > WHOLE_FILE_BYTES or start + length > info.end:
                    return self.store.read_ranges([(file, start, start + length)])[0]
                data = _read_head(self.store, file, info.end)
                if isinstance(data, BaseException):
                    return data
                self._put(key, data)
        return data[start : start + length]

    def _plan(self, file: str, start: int, length: int) -> list[tuple[str, int, int]]:
        """Ranges to fetch for a miss on (file, start): this record's file and the next ones."""
        info = self.files.get(file)
        if info is None:  # not from an index we loaded: just this record
            return [(file, start, start + length)]
        name = info.records.get(start, (length, None))[1]
        plan, total = [], 0
        i = bisect_left(self._order, (info.step, info.worker, file))
        for _, _, f in self._order[i:]:
            if len(plan) >= WINDOW_FILES or total >= WINDOW_BYTES:
                break
            other = self.files[f]
            at = start if f == file else other.by_name.get(name)
            if at is None or (f != file and (f, at) in self._cache):
                continue
            if other.end <= WHOLE_FILE_BYTES:
                plan.append((f, 0, other.end))
                total += other.end
            else:
                rec_len = other.records[at][0]
                plan.append((f, at, at + rec_len))
                total += rec_len
        return plan

    def _put(self, key: tuple[str, int], data: bytes) -> None:
        old = self._cache.pop(key, None)
        if old is not None:
            self._cached_bytes -= len(old)
        self._cache[key] = data
        self._cached_bytes += len(data)
        while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= len(evicted)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._cached_bytes = 0


def _read_head(store, file: str, size: int) -> bytes | BaseException:
    """The first ``size`` bytes of a local file of the run (fewer when it is shorter), or the error."""
    if not hasattr(store, "open_regular"):  # a plugin's store: what the Store protocol offers
        try:
            return store.read_bytes(file, 0, size)
        except OSError as exc:
            return exc
    try:
        fd, real_size = store.open_regular(store.path(file))
    except (OSError, CorruptRunError) as exc:
        return exc
    try:
        return read_at(fd, 0, min(size, real_size))
    except OSError as exc:
        return exc
    finally:
        os.close(fd)
