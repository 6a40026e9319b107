"""Writing a run: one ``Writer`` contract, and the factory that picks the thread or the process writer.

- ``protocol``: the Writer Protocol (what the hook, the rule runner and close call)
- ``thread_writer``: RunWriter, encoding on a background thread; ``outbox``: in-order publishing, retries
- ``process_writer``, ``child_link``, ``wire``, ``child``: a local run's writer in a process of its own
- ``ownership``: the out_dir check and the worker's claim in the run
- ``settings``: sizes, timeouts and their environment variables; ``bounded``: calls bounded in time
"""

from __future__ import annotations

from collections.abc import Callable

from smdebug.store import Store
from smdebug.writing.process_writer import ProcessWriter
from smdebug.writing.protocol import Writer
from smdebug.writing.thread_writer import RunWriter

__all__ = ["ProcessWriter", "RunWriter", "Writer", "open_writer"]


def open_writer(
    uri: str,
    worker: str,
    store: Store | None,
    open_store: Callable[[], Store],
    max_queue_bytes: int | None = None,
    *,
    claim: tuple[str, str | None] | None = None,
    claim_token: str | None = None,
) -> Writer:
    """The writer of ``worker`` in the run at ``uri``: a local run's works in a process of its own (off the
    training process's GIL), any other on threads. ``store`` is the run's store when it is open already,
    else the writer opens it with ``open_store`` on its own thread. ``claim``: see RunWriter."""
    writer_class = ProcessWriter if ProcessWriter.wanted(uri, store) else RunWriter
    return writer_class(
        store or open_store,
        worker,
        max_queue_bytes,
        uri=uri,
        claim=claim,
        claim_token=claim_token,
    )
