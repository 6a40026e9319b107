"""Worker names in a distributed MXNet job: a Horovod job's rank, or the rank of the job's distributed
kvstore (``dist_sync``/``dist_async``, MXNet's parameter server, whose processes have DMLC_ROLE=worker).

A kvstore has no global registry: the script's is found once among the live objects, only in a
parameter-server worker, and remembered.
"""

from __future__ import annotations

import gc
import os
import sys
import weakref

import mxnet as mx

_found: list = []  # a weak reference to this worker's distributed kvstore, once found


def _kvstore():
    kv = _found[0]() if _found else None
    if kv is None and os.environ.get("DMLC_ROLE") == "worker":
        for obj in gc.get_objects():
            if isinstance(obj, mx.kvstore.KVStore) and str(obj.type).startswith("dist"):
                kv = obj
                _found[:] = [weakref.ref(obj)]
                break
    return kv


def _horovod(what: str):
    """Horovod's rank or size when a Horovod job runs (smdebug 1.0's way to name MXNet workers)."""
    if "horovod.mxnet" not in sys.modules:
        return None
    try:
        return int(getattr(sys.modules["horovod.mxnet"], what)())
    except Exception:  # not initialised
        return None


def rank() -> int | None:
    """This worker's rank, or None when no distributed job is known."""
    found = _horovod("rank")
    if found is None and (kv := _kvstore()) is not None:
        found = kv.rank
    return found


def size() -> int | None:
    found = _horovod("size")
    if found is None and (kv := _kvstore()) is not None:
        found = kv.num_workers
    return found


def unnamed_ps_worker() -> bool:
    """A parameter-server worker whose kvstore does not exist yet (a Trainer creates it at its first step)."""
    return os.environ.get("DMLC_ROLE") == "worker" and rank() is None
