"""The writers' settings: sizes and timeouts, and the environment variables that change them."""

from __future__ import annotations

import os

from smdebug.env import env_number

DEFAULT_MAX_QUEUE_BYTES = 256 * 1024 * 1024
DEFAULT_CLOSE_TIMEOUT = 60.0  # seconds close() keeps retrying a failing store before giving up
DEFAULT_CHECK_TIMEOUT = 5.0  # seconds a new hook waits for the out_dir check before training goes on
BATCH_BYTES = 1024 * 1024  # a step's tensors reach the encoder thread together below this size
RESERVE_BYTES = 1024 * 1024  # a tensor this large is copied for the writer only once the queue has room
SCALAR_BYTES = 256  # what a tensor's reductions count in the queue (encoded: a few small records)
# What each queued record counts in the queue besides its array's bytes and its name's: the item tuple,
# the array object, its index entry and its event header (measured: ~300-450 bytes a scalar record).
RECORD_BYTES = 512
# Of a writer's memory bound, this share (at most) holds the encoder's per-name cache of event headers,
# and as much the writer process's table of reduction-name lists: the queue gets the rest.
CACHE_SHARE = 8
RETRY_FIRST, RETRY_MAX = 0.25, 8.0  # backoff between retries of a failing store, in seconds
CLOSE_RETRY_MAX = 2.0  # backoff cap while close() drains
# Environment variables of launchers that start several workers (each then names itself by its rank,
# possibly only once its framework's distributed setup is done).
_WORLD_SIZE_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "DMLC_NUM_WORKER")
WRITER_PROCESS_ENV = "SMDEBUG_WRITER_PROCESS"  # 0 keeps a local run's writer on threads


def record_bytes(name: str) -> int:
    """What a record named ``name`` counts in a writer's queue besides its array's bytes."""
    return len(name) + RECORD_BYTES


class NamesBytes:
    """What a step's lists of reduction names count in a writer's queue (record_bytes of each name),
    computed once for the same list object: a hook gives the same lists step after step."""

    __slots__ = ("names", "nbytes")

    def __init__(self) -> None:
        self.names: list | None = None  # held: its id stays its own
        self.nbytes = 0

    def __call__(self, names: list[list[str]]) -> int:
        if names is not self.names:
            self.nbytes = sum(len(name) for some in names for name in some) + RECORD_BYTES * sum(
                map(len, names)
            )
            self.names = names
        return self.nbytes


def cache_bytes(max_queue_bytes: int) -> int:
    """What a writer's per-name caches may hold, each, within its memory bound."""
    return max_queue_bytes // CACHE_SHARE


def max_queue_bytes_from_env() -> int:
    return env_number("SMDEBUG_MAX_QUEUE_BYTES", DEFAULT_MAX_QUEUE_BYTES, integer=True, positive=True)


def close_timeout_from_env() -> float:
    return env_number("SMDEBUG_CLOSE_TIMEOUT", DEFAULT_CLOSE_TIMEOUT)


def check_timeout_from_env() -> float:
    return env_number("SMDEBUG_CHECK_TIMEOUT", DEFAULT_CHECK_TIMEOUT)


def writer_process_allowed() -> bool:
    """Whether SMDEBUG_WRITER_PROCESS leaves a local run its writer process (anything but 0/false/no/off)."""
    return os.environ.get(WRITER_PROCESS_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def one_of_many_workers() -> bool:
    """Whether a launcher started this process as one of several workers (torchrun, mpirun, ...)."""
    for name in _WORLD_SIZE_ENV:
        try:
            if int(os.environ.get(name, "1")) > 1:
                return True
        except ValueError:
            pass
    return False
