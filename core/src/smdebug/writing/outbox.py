"""The outbox: finished steps and files, published to the store in order, retried while it fails.

A writer hands each finished step (its event file, then its index) or metadata file to the outbox; one
publisher thread sends them in order, so a live reader never sees step n+1 before step n, nor half a step.
When the store fails (an S3 outage) the outbox waits, spilled to local disk beyond a small memory budget,
and retries with backoff while training goes on. At close it drains until its deadline, then records what
could not be saved (``unsaved_steps/<worker>.json``) before the end-of-job marker, so a run that lost
steps never looks complete.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time

from smdebug import layout
from smdebug.exceptions import OutDirExistsError
from smdebug.layout import END_OF_JOB_FILE, event_file_path, index_file_path
from smdebug.store import SINGLE_PUT_BYTES, Store
from smdebug.writing.ownership import ClaimPublication, release_worker
from smdebug.writing.settings import CLOSE_RETRY_MAX, RETRY_FIRST, RETRY_MAX, check_timeout_from_env

logger = logging.getLogger("smdebug")

# What a waiting publication holds besides its files' bytes in memory: its objects, the staged file's,
# the paths (measured: ~1.5 KB a one-scalar step).
PUBLICATION_BYTES = 1536
# An upload holds a file's bytes twice: the bytes handed to the store's client, and the copy the client
# makes to send them (measured with s3fs: +8.6 MiB for an 8 MiB PUT). Larger files are streamed in parts.
UPLOAD_COPIES = 2
# A remote publication in flight longer than SMDEBUG_CHECK_TIMEOUT plus this many seconds a MiB it sends
# (a store slower than 1 MiB/s) counts as a failing store: a request that hangs never fails.
HUNG_SECONDS_PER_MIB = 1.0
_WAITING_FULL = (
    "not kept: the store was failing and the steps waiting for it filled their share of the writer's memory "
    "bound (max_queue_bytes)"
)


def format_steps(steps) -> str:
    """ "3, 4, 6"; a long list as ranges, cut in the middle ("0-99, 200-299, ..., 9000-9999 (N steps)"), so
    that losing 20,000 steps is said in one short line."""
    steps = sorted(steps)
    if len(steps) <= 20:
        return ", ".join(str(s) for s in steps)
    ranges, start = [], steps[0]
    for prev, step in zip(steps, steps[1:] + [None]):
        if step != prev + 1 if step is not None else True:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = step
    if len(ranges) > 10:
        ranges = ranges[:5] + ["..."] + ranges[-2:]
    return f"{', '.join(ranges)} ({len(steps)} steps)"


def unsaved_report(failed_steps: dict[int, str], failed_files: dict[str, str]) -> str:
    """Which steps and files could not be saved, and why (steps grouped by reason); empty when none."""
    by_reason: dict[str, list] = {}
    for step, why in sorted(failed_steps.items()):
        by_reason.setdefault(why, []).append(step)
    parts = []
    if failed_steps:
        groups = "; ".join(f"{format_steps(steps)} ({why})" for why, steps in by_reason.items())
        parts.append(f"{len(failed_steps)} step(s) could not be saved: {groups}")
    if failed_files:
        files = ", ".join(f"{f} ({why})" for f, why in sorted(failed_files.items()))
        parts.append(f"file(s) could not be saved: {files}")
    return "; ".join(parts)


class Publication:
    """Files to publish in order (a step's event file then its index, or one metadata file)."""

    def __init__(self, step: int | None, parts: list):
        self.step = step
        self.parts = parts  # a staged file (the store's: any StagedFile protocol object), or (relpath, bytes)
        self.file = None if step is not None else parts[0][0]
        self.memory = 0  # what it counted for in the outbox's memory budget
        self.cancelled = False  # close() gave up on it: a request outlived the drain or the close timeout

    @property
    def what(self) -> str:
        return f"step {self.step}" if self.step is not None else f"file {self.file}"

    def publish(self, store: Store) -> None:
        # parts already published are not sent again on a retry; once cancelled, none is begun (the
        # step's index comes last: a step whose event file outlived close stays invisible to readers)
        while self.parts and not self.cancelled:
            part = self.parts[0]
            if not isinstance(part, tuple):
                part.commit()
            else:
                store.write_bytes(*part)
            self.parts.pop(0)

    def in_memory(self) -> int:
        return sum(len(p[1]) if isinstance(p, tuple) else p.in_memory for p in self.parts)

    def objects(self) -> int:
        """What it holds in memory besides its staged files: its objects and its index."""
        return PUBLICATION_BYTES + sum(len(p[1]) for p in self.parts if isinstance(p, tuple))

    def sending(self) -> int:
        """What it holds in memory while it is sent to a remote store: its objects, and each file twice
        (the bytes handed to the client, and the client's copy)."""
        held = self.objects()
        for p in self.parts:
            held += UPLOAD_COPIES * (len(p[1]) if isinstance(p, tuple) else min(p.size, SINGLE_PUT_BYTES))
        return held

    def spill(self) -> None:
        for p in self.parts:
            if not isinstance(p, tuple):
                p.spill()

    def discard(self) -> None:
        for p in self.parts:
            if not isinstance(p, tuple):
                p.discard()
        self.parts = []


class Outbox:
    """The publishing half of a writer (RunWriter): the outbox, its publisher thread and close's drain.

    The writer provides ``store`` (set before ``_store_ready``), ``uri``, ``worker``, ``max_queue_bytes``,
    ``failed_steps``, ``failed_files``, ``written_steps``, ``refused``, ``_unwritten`` and ``_describe``,
    and its memory account: ``_lock`` (a Condition), ``_held`` (the bytes it holds, guarded by it) and
    ``_limit``. Waiting steps and uploads in flight count in ``_held`` too."""

    _end_written = False
    _finisher: threading.Thread | None = None  # the thread writing close's own files (the publisher, or
    # one close started beside it)
    _final_left: list = []  # close's own files (record, note, marker) still to write
    _close_deadline = float("inf")

    def _start_outbox(self, claim: tuple[str, str | None] | None, claim_token: str | None) -> None:
        # the publisher's state, guarded by _lock
        self._outbox: collections.deque = collections.deque()
        self._outbox_memory = 0
        self._publishing = None  # the publication being sent right now
        self._flight = 0  # what its upload holds beyond what it counts itself (the client's copies)
        # when the publication being sent counts as hung (a remote store's request that does not
        # return), and the one whose hang was warned of
        self._hung_at = float("inf")
        self._hung_warned = None
        self._hung_after = check_timeout_from_env()
        self._sent_at = 0.0
        self._room_waiters = 0  # threads waiting for what the writer holds to go down
        self._send_waiters = 0  # threads waiting for a publication to be sent (flush, a step reopened)
        self._failing = False  # the last attempt failed: the outbox waits for a retry
        self._retry_at = 0.0
        self._backoff = RETRY_FIRST
        self._last_error = ""
        self._unsaved_reason: str | None = None  # why the last step could not be saved (warned once)
        self._unsaved_step = -1  # (and which step that was)
        self._store_ready = threading.Event()
        self._encoded_all = False  # the encoder has handed over everything queued before close
        self._drain_deadline: float | None = None
        self._end_of_job = False
        self._abandoned = False
        # the token of this worker's claim in the run, dropped once the end-of-job marker is written
        self._claim_token = claim[0] if claim is not None else claim_token
        if claim is not None:
            self._outbox.append(ClaimPublication(self.worker, *claim))
        self._publisher = threading.Thread(
            target=self._publish_loop, name=f"smdebug-publisher-{self.worker}", daemon=True
        )
        self._publisher.start()

    @property
    def pending_steps(self) -> list[int]:
        """Finished steps waiting for the store to come back."""
        with self._lock:
            return [p.step for p in self._outbox if p.step is not None]

    @property
    def failing(self) -> bool:
        """Whether the store is failing (steps wait in the outbox for a retry)."""
        return self._failing

    def _wait_published(self, deadline: float) -> bool:
        """Wait until the outbox is empty, or waits for a failing store to come back (flush's second half)."""
        with self._lock:
            while (
                self._outbox
                and not (self._failing and self._publishing is None)
                and not self._hung()
                and not self.refused
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._publisher.is_alive():
                    return False
                self._wait_for_sending(min(remaining, self._until_hung() or remaining))
        return True

    def _wait_for_sending(self, timeout: float) -> None:
        """Wait (holding _lock) until a publication was sent: a success wakes the threads waiting for
        that only when some are (the idle publisher is not woken for each step sent without it)."""
        self._send_waiters += 1
        try:
            self._lock.wait(timeout)
        finally:
            self._send_waiters -= 1

    def _start_drain(self, deadline: float, timeout: float, end_of_job: int) -> None:
        """close(): publish until shortly before ``deadline``, then the record of unsaved steps and the
        end-of-job marker."""
        with self._lock:
            # a short reserve at the end for the record of unsaved steps and the end-of-job marker
            self._drain_deadline = deadline - min(1.0, timeout / 4)
            self._close_deadline = deadline
            self._end_of_job = end_of_job
            self._lock.notify_all()

    def unsaved_report(self) -> str:
        """Which steps and files could not be saved, and why (grouped by reason); empty when all were."""
        return unsaved_report(self.failed_steps, self.failed_files)

    def _abandon(self, timeout: float) -> None:
        """close() timed out on a request that does not return: whatever is not confirmed written by now
        is reported unsaved, and the threads write nothing more."""
        with self._lock:
            self._abandoned = True
            why = f"not written within the close timeout ({timeout:g} s)"
            if self._last_error:
                why += f"; last error: {self._last_error}"
            for step in sorted(self._unwritten.copy()):
                self.failed_steps.setdefault(step, why)
            for pub in self._outbox:
                if pub.file is not None:
                    self.failed_files.setdefault(pub.file, why)
                pub.cancelled = True
                if pub is not self._publishing:  # its temp files go now, not at interpreter exit
                    pub.discard()
            for relpath in list(self._final_left):  # close's own files not written yet
                self.failed_files.setdefault(relpath, why)
            if self._end_of_job and not self._end_written:
                self.failed_files.setdefault(END_OF_JOB_FILE, why)
            self._lock.notify_all()
        logger.warning("smdebug: %s did not answer within the close timeout (%g s)", self.uri, timeout)

    def _publish(self, pub: Publication, counted: int = 0) -> None:
        """Hand a finished step or file to the publisher (in order: a live reader must never see step
        n+1 before step n). ``counted``: what its staged file already counts in the writer's bound."""
        if self.refused:
            self._count(-counted)
            self._given_up(pub, self.refused, quiet=True)
            return
        extra = pub.objects()
        with self._lock:
            # A healthy store slower than the encoder (a rename and a write a step) makes the encoder
            # wait, and so training at the bound, rather than the outbox grow without end. A failing
            # store does not: training goes on, the waiting steps spilled to disk.
            while (
                self._outbox
                and self._held + extra > self._limit
                and not (self._failing or self._hung() or self._abandoned or self._draining_over())
                and self._publisher.is_alive()
            ):
                self._wait_for_room(0.5)
            failing = self._failing or self._hung()
            if failing and not self._failing:
                self._note_hung()
        keep = counted  # what its staged file counts: none once on disk
        if failing:  # waiting steps go to local disk (before the publisher can see them)
            pub.spill()
            keep = 0
        with self._lock:
            if (
                (self._failing or self._hung())
                and self._outbox
                and self._outbox_memory + extra > self._limit // 2
            ):
                # a long outage: what the waiting steps hold in memory (their objects, their index) has
                # reached its share of the bound; the next steps are recorded unsaved, training goes on
                self._held -= counted
                self._given_up(pub, _WAITING_FULL)
                self._lock.notify_all()
                return
            pub.memory = keep + extra
            self._held += pub.memory - counted
            self._outbox_memory += pub.memory
            self._outbox.append(pub)
            # A local store's step with nothing before it is sent by this thread itself: waking the
            # publisher for a rename and an index write cost more CPU than they do (two thread hand-offs
            # a step, in a writer process that shares the cores with training).
            inline = self.store.is_local and self._outbox[0] is pub and self._publishing is None
            inline = inline and not self._failing and self._drain_deadline is None
            if inline:
                self._publishing = pub  # (a local store: never counted as hung)
            else:
                self._lock.notify_all()
        if inline:
            self._send(pub)

    def _wait_for_room(self, timeout: float | None = None) -> None:
        """Wait (holding _lock) until what the writer holds may have gone down: ``_count`` wakes only
        the threads waiting here for that, and only when some are."""
        self._room_waiters += 1
        try:
            self._lock.wait(timeout)
        finally:
            self._room_waiters -= 1

    def _parked(self) -> int:
        """What steps waiting for a failing store hold (their objects, and the upload of the one being
        retried): training never waits on it."""
        return self._outbox_memory + self._flight if self._failing or self._hung() else 0

    def _hung(self) -> bool:
        """Whether the publication being sent is hung (under _lock): a remote store's request that has not
        returned for long is a failing store for training, though it never fails."""
        return self._publishing is not None and time.monotonic() >= self._hung_at

    def _until_hung(self) -> float | None:
        """Seconds until the publication being sent counts as hung (a waiter must look again then);
        None when there is none to wait for."""
        if self._publishing is None or self._hung_at == float("inf"):
            return None
        left = self._hung_at - time.monotonic()
        return left + 0.01 if left > 0 else None

    def _note_hung(self) -> None:
        """The publication being sent is hung (under _lock): warned of once, and the steps waiting after
        it go to local disk, as for a failing store. Publishing resumes in order once it returns."""
        pub = self._publishing
        if pub is None or self._hung_warned is pub:
            return
        self._hung_warned = pub
        logger.warning(
            "smdebug: %s has not answered for %.0f s (writing %s); the steps after it wait on local disk "
            "while training goes on",
            self.uri,
            time.monotonic() - self._sent_at,
            pub.what,
        )
        self._spill_waiting()

    def _count(self, nbytes: int) -> None:
        """Count nbytes more (fewer when negative) in what the writer holds."""
        if nbytes:
            with self._lock:
                self._held += nbytes
                if nbytes < 0 and self._room_waiters:
                    self._lock.notify_all()

    def _spill_waiting(self) -> None:
        """The store fails: the steps waiting for it go to local disk, keeping only their objects in
        memory (called by the publisher, under _lock, so never while it reads them)."""
        for pub in self._outbox:
            if pub is self._publishing:  # (being read: a hung one is sent from memory)
                continue
            if isinstance(pub, Publication) and pub.memory > pub.objects():
                pub.spill()
                self._held -= pub.memory - pub.objects()
                self._outbox_memory -= pub.memory - pub.objects()
                pub.memory = pub.objects()
        self._lock.notify_all()

    def _forget_outbox(self) -> None:
        self._held -= self._outbox_memory
        self._outbox_memory = 0

    def _draining_over(self) -> bool:
        return self._drain_deadline is not None and time.monotonic() >= self._drain_deadline

    # -- publisher thread ---------------------------------------------------------------------------
    def _publish_loop(self) -> None:
        self._store_ready.wait()
        while True:
            pub = self._next()
            if pub is None:
                break
            self._send(pub)
        self._finish_close()

    def _send(self, pub) -> None:
        """Publish ``pub``, the outbox's first (``_publishing``), and note how that went."""
        # an upload holds the file's bytes (and the client's copy) while it is in flight: beyond what
        # the step counts, when it waited on disk for a failing store
        flight = 0
        if not self.store.is_local and isinstance(pub, Publication):
            flight = max(0, pub.sending() - pub.memory)
        self._flight = flight
        self._count(flight)
        try:
            pub.publish(self.store)
        except Exception as exc:
            self._flight = 0
            self._count(-flight)
            self._attempt_failed(pub, exc)
        else:
            self._flight = 0
            self._count(-flight)
            self._attempt_succeeded(pub)
        if getattr(pub, "cancelled", False):  # close() gave up on it while it was sent: its files go now
            pub.discard()

    def _next(self):
        """The publication to send now (waiting out the backoff of a failing store); None to stop."""
        with self._lock:
            while True:
                if self._abandoned:
                    return None
                if self.refused:
                    self._refuse_outbox()
                now = time.monotonic()
                draining = self._drain_deadline is not None and self._encoded_all
                if draining and (not self._outbox or now >= self._drain_deadline):
                    return None
                # (a step the encoder thread is sending itself is _publishing: waited for)
                waiting = self._outbox and self._publishing is None
                if waiting and (not self._failing or now >= self._retry_at):
                    self._publishing = pub = self._outbox[0]
                    if not self.store.is_local:
                        sent = pub.sending() if isinstance(pub, Publication) else 0
                        self._sent_at = now
                        self._hung_at = now + self._hung_after + HUNG_SECONDS_PER_MIB * sent / 2**20
                    return pub
                timeout = self._retry_at - now if waiting else None
                if self._drain_deadline is not None:
                    left = self._drain_deadline - now
                    timeout = left if timeout is None else min(timeout, left)
                    timeout = max(timeout, 0.01)
                self._lock.wait(timeout)

    def _transient(self, exc: BaseException) -> bool:
        """Whether a failed write is worth retrying: anything from a remote store (while a server comes
        back it may answer "no such bucket" or "access denied" too), nothing from a local disk."""
        if isinstance(exc, OutDirExistsError):
            return False
        return not self.store.is_local and not isinstance(exc, (ValueError, TypeError))

    def _attempt_failed(self, pub, exc: BaseException) -> None:
        reason = self._describe(exc)
        with self._lock:
            self._publishing = None
            self._last_error = reason
            if self._abandoned:
                return
            if isinstance(exc, OutDirExistsError):
                self.refused = f"out_dir {self.uri} already holds {exc}"
                logger.error(
                    "smdebug: nothing is saved: %s already holds %s; smdebug does not mix two runs in one "
                    "directory: choose a new out_dir",
                    self.uri,
                    exc,
                )
                self._refuse_outbox()
            elif not self._transient(exc):
                self._pop(pub)
                self._given_up(pub, reason)
            else:
                if not self._failing:
                    logger.warning(
                        "smdebug: could not write %s to %s: %s; retrying in the background while training "
                        "goes on",
                        pub.what,
                        self.uri,
                        reason,
                    )
                    self._backoff = RETRY_FIRST
                    self._spill_waiting()
                else:
                    cap = CLOSE_RETRY_MAX if self._drain_deadline is not None else RETRY_MAX
                    self._backoff = min(self._backoff * 2, cap)
                    logger.debug("smdebug: retry of %s failed: %s", pub.what, reason)
                self._failing = True
                self._retry_at = time.monotonic() + self._backoff
            self._lock.notify_all()

    def _attempt_succeeded(self, pub) -> None:
        with self._lock:
            self._publishing = None
            if pub.step is not None and pub.cancelled and pub.step in self.failed_steps:
                # close() already reported this step unsaved (the request outlived its timeout): take it
                # out of the run again, so that the run and the report agree
                undo = True
            else:
                undo = False
                self._pop(pub)
        if undo:
            for relpath in (index_file_path(pub.step, self.worker), event_file_path(pub.step, self.worker)):
                try:
                    self.store.remove(relpath)
                except Exception as exc:
                    logger.debug("smdebug: could not remove %s: %s", relpath, self._describe(exc))
            return
        with self._lock:
            if pub.step is not None:
                self.written_steps.append(pub.step)
                self._unwritten.discard(pub.step)
                if pub.step > self._unsaved_step:  # saving works again: the next failure is warned of
                    self._unsaved_reason = None
            waiters = self._room_waiters or self._send_waiters
            wake = self._outbox or waiters or self._drain_deadline is not None
            if self._hung_warned is pub:
                self._hung_warned = None
                logger.warning(
                    "smdebug: %s answered again; writing %d waiting item(s)", self.uri, len(self._outbox)
                )
            if self._failing:
                wake = True
                self._failing = False
                self._backoff = RETRY_FIRST
                logger.warning(
                    "smdebug: %s is reachable again; writing %d waiting item(s)",
                    self.uri,
                    len(self._outbox) + 1,
                )
            if wake:  # (else only the idle publisher waits, for a publication to send: there is none)
                self._lock.notify_all()

    def _pop(self, pub) -> None:
        if self._outbox and self._outbox[0] is pub:
            self._outbox.popleft()
            self._outbox_memory -= pub.memory
            self._held -= pub.memory

    def _refuse_outbox(self) -> None:
        while self._outbox:
            self._given_up(self._outbox.popleft(), self.refused, quiet=True)
        self._forget_outbox()

    def _warn_unsaved(self, what: str, reason: str, step: int | None = None) -> None:
        """Warn of a step or file that could not be saved, once for a run of them failing alike (a full
        disk fails every step until space is freed): close lists them all."""
        self._unsaved_step = max(self._unsaved_step, -1 if step is None else step)
        if reason == self._unsaved_reason:
            logger.debug("smdebug: could not save %s to %s: %s", what, self.uri, reason)
            return
        self._unsaved_reason = reason
        logger.warning(
            "smdebug: could not save %s to %s: %s (what else fails so is listed at close)",
            what,
            self.uri,
            reason,
        )

    def _given_up(self, pub, reason: str, quiet: bool = False) -> None:
        if not quiet:
            self._warn_unsaved(pub.what, reason, pub.step)
        if pub.step is not None:
            self.failed_steps[pub.step] = reason
        elif pub.file is not None:
            self.failed_files[pub.file] = reason
        pub.discard()

    def _finish_beside(self) -> threading.Thread | None:
        """close(), past the drain, with the publisher still in a request (one the store keeps failing,
        retried inside its client, or that hangs): that step and what waits behind it are unsaved, and
        close writes the record and the marker itself (on a thread of its own: close waits for it only
        until its deadline): that thread. None when the publisher is not in a request (it finishes the
        close)."""
        with self._lock:
            pub = self._publishing
            if pub is None or self._abandoned or self._finisher is not None:
                return None
            why = self._last_error or "not written before the close timeout"
            if pub.step is not None:
                self.failed_steps.setdefault(pub.step, why)
            elif pub.file is not None:
                self.failed_files.setdefault(pub.file, why)
            pub.cancelled = True  # (its index is not sent after it; a step it lands is taken out again)
            if self._outbox and self._outbox[0] is pub:
                self._outbox.popleft()
        closer = threading.Thread(target=self._finish_close, name=f"smdebug-close-{self.worker}", daemon=True)
        closer.start()
        return closer

    def _finish_close(self) -> None:
        """At close, past the drain: what is still waiting is unsaved; then the record of the unsaved
        steps and the end-of-job marker, in that order, the marker only once the record is written."""
        with self._lock:
            if self._abandoned or self._finisher is not None:
                return
            self._finisher = threading.current_thread()
            why = self._last_error or "not written before the close timeout"
            while self._outbox:
                self._given_up(self._outbox.popleft(), why, quiet=True)
            self._forget_outbox()
            end_of_job, refused = self._end_of_job, self.refused
        failing = False
        if refused or self.store is None:
            return
        final = []
        if self.failed_steps or self.failed_files:
            record = layout.encode_unsaved(self.worker, self.failed_steps, self.failed_files)
            final.append((layout.unsaved_steps_path(self.worker), record))
        if end_of_job > 1:  # (a run of several workers: the last of them to end writes the marker)
            final.append((layout.ended_note_path(self.worker), b"{}"))
        if end_of_job:
            final.append((END_OF_JOB_FILE, b""))
        self._final_left = [relpath for relpath, _ in final]
        for relpath, data in final:
            # A store that failed until now (one object it refuses, an outage that just ended) is tried
            # once more with what is left of close's time (close() stops waiting at its deadline): only
            # a failed attempt leaves the run without its record, so never looking complete
            if failing or time.monotonic() >= self._close_deadline:
                self.failed_files[relpath] = why
                continue
            try:
                if self._abandoned:
                    return
                ended, last = [], True
                if relpath == END_OF_JOB_FILE and end_of_job > 1:
                    # the workers that write the run are those with a collections file (not every rank
                    # may have a hook: a script's `if rank == 0` hook counts the job's ranks all the same):
                    # the last of them to end writes the marker
                    ended = self.store.list(layout.ENDED_DIR)
                    writers = [
                        p for p in self.store.list(layout.COLLECTIONS_DIR) if layout.is_collections_file(p)
                    ]
                    last = len(ended) >= len(writers)
                if last:
                    self._write_final(relpath, data)
                if relpath == END_OF_JOB_FILE:
                    self._end_written = True
                    # a finished run is protected by its marker: the claim and the workers' notes go, and
                    # the run holds exactly smdebug 1.0's files
                    if self._claim_token:
                        release_worker(self.store, self.worker, self._claim_token)
                    if last and ended:
                        for note in ended:
                            # (a peer that decided it was last at the same moment removes them too)
                            with contextlib.suppress(FileNotFoundError):
                                self.store.remove(note)
                        if self.store.is_local:
                            with contextlib.suppress(OSError):
                                os.rmdir(self.store.path(layout.ENDED_DIR))
                self._final_left.remove(relpath)
            except Exception as exc:
                failing = True  # without the record of unsaved steps, the run must not look complete
                why = self._describe(exc)
                self.failed_files[relpath] = why

    def _write_final(self, relpath: str, data: bytes) -> None:
        """Write a file of close (the record of unsaved steps, a note, the marker). A marker already
        there is no failure: a peer that decided it was last at the same moment wrote it."""
        try:
            self.store.write_bytes(relpath, data)
        except Exception:
            if relpath != END_OF_JOB_FILE or not self.store.exists(END_OF_JOB_FILE):
                raise
