"""The one contract of a run's writer: everything the hook, the rule runner and close may call.

The core's two writers (RunWriter on threads, ProcessWriter with a child process) implement it; the hook
depends on this Protocol only. Plugins extend storage (``smdebug_open_store``), not the writer.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from smdebug.modes import ModeKeys


@runtime_checkable
class Writer(Protocol):
    """Writes one worker's steps to a run, off the training thread; never raises into training."""

    uri: str  # where it writes, credentials redacted (for messages)
    worker: str
    max_queue_bytes: int

    # -- what was written and what could not be ---------------------------------------------------
    @property
    def written_steps(self) -> list[int]:
        """Steps published whole (event file, then index), in order."""

    @property
    def failed_steps(self) -> dict[int, str]:
        """Steps that will never be saved, and why."""

    @property
    def failed_files(self) -> dict[str, str]:
        """Metadata files that could not be saved, and why."""

    @property
    def refused(self) -> str | None:
        """Why this writer writes nothing at all (the run is another writer's), or None."""

    @property
    def pending_steps(self) -> list[int]:
        """Finished steps waiting for a failing store to come back."""

    @property
    def failing(self) -> bool:
        """Whether the store is failing (steps wait for a retry)."""

    # -- the training thread ----------------------------------------------------------------------
    def write_tensor(
        self,
        step: int,
        mode: ModeKeys,
        mode_step: int,
        name: str,
        array: np.ndarray,
        wall_time: float | None = None,
        reserved: int = 0,
    ) -> None:
        """Queue a host array the writer keeps (the caller does not change it); ``reserved``: bytes
        already counted in the queue with ``reserve``."""

    def write_view(self, step: int, mode: ModeKeys, mode_step: int, name: str, view: np.ndarray) -> None:
        """Queue a view of memory that training changes once this returns (the writer copies it now)."""

    def write_scalars(
        self, step: int, mode: ModeKeys, mode_step: int, names: list[list[str]], values, wall_time: float
    ) -> None:
        """Queue a step's reductions: ``values[i]`` holds the 0-d tensors named ``names[i]``."""

    def write_shape(self, step: int, mode: ModeKeys, mode_step: int, name: str, shape) -> None:
        """Record a tensor's shape at a step."""

    def reserve(self, nbytes: int) -> None:
        """Wait until the queue has room for ``nbytes`` more (negative: give back a reservation)."""

    def end_step(self, step: int) -> None:
        """The step is complete: its files can be published."""

    def write_file(self, relpath: str, data: bytes) -> None:
        """Publish a metadata file of the run (the collections file)."""

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued is written or waits for a failing store; False on timeout."""

    def close(self, timeout: float | None = None, end_of_job: int = 0) -> dict[int, str]:
        """Write what is queued and stop within ``timeout``; the end-of-job marker last with
        ``end_of_job``. Returns the steps that could not be saved."""

    def unsaved_report(self) -> str:
        """Which steps and files could not be saved, and why; empty when all were."""
