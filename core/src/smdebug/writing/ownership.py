"""Run ownership: who may write a worker's files in a run.

A new hook checks its out_dir (an earlier run there, another writer of this worker) and claims its worker
name (``writers/<worker>.json``, created exclusively), on a thread of its own. A writer whose hook could
not finish that check publishes the claim before anything else (``ClaimPublication``): a second writer of
the same worker in one out_dir writes nothing. A finished run drops its claims (its end-of-job marker
protects it).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from smdebug import layout
from smdebug.exceptions import ConfigError, OutDirExistsError, SMDebugError
from smdebug.layout import DEFAULT_WORKER, existing_run
from smdebug.store import Store, redact
from smdebug.writing.bounded import at_exit, run_bounded
from smdebug.writing.settings import check_timeout_from_env, one_of_many_workers

logger = logging.getLogger("smdebug")
PROBE_SECONDS = 1.0  # the connection probe of a remote store's endpoint


def _endpoint_address(store=None, uri: str = "") -> tuple[str, int] | None:
    """(host, port) of a remote store's configured endpoint (s3fs's option or the AWS environment);
    None when there is none to probe (AWS's own endpoints, another filesystem). Without a store, that of
    an s3:// ``uri`` as fsspec's configuration and the environment give it (no s3fs imported)."""
    from urllib.parse import urlsplit

    if store is None:
        if uri.split("://", 1)[0] not in ("s3", "s3a") or "://" not in uri:
            return None
        import fsspec.config

        options = fsspec.config.conf.get("s3", {})
        url, protocols = options.get("endpoint_url"), ("s3",)
        url = url or (options.get("client_kwargs") or {}).get("endpoint_url")
    else:
        fs = getattr(store, "fs", None)
        url, protocols = getattr(fs, "endpoint_url", None), getattr(fs, "protocol", ())
        url = url or (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")
    url = url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not url or "s3" not in protocols:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None


def claim_worker(store: Store, worker: str, token: str) -> str | None:
    """Claim ``worker`` in the run of ``store``; None when it is ours (now, or by an earlier call with the
    same token), else what holds it. The claim file is created exclusively, so of two writers starting
    together exactly one gets it (atomic locally and on S3; see Store.create_exclusive)."""
    relpath = layout.writer_claim_path(worker)
    claim = {"worker": worker, "token": token, "host": socket.gethostname(), "pid": os.getpid()}
    claim["started"] = time.time()
    try:
        store.create_exclusive(relpath, json.dumps(claim).encode())
        return None
    except FileExistsError:
        pass
    try:
        other = json.loads(store.read_bytes(relpath))
    except (OSError, ValueError):
        other = {}  # being written by its owner right now
    if not isinstance(other, dict):
        other = {}
    if other.get("token") == token:
        return None
    who = f"host {other.get('host', '?')}, pid {other.get('pid', '?')}"
    return f"a run being written by another writer of {worker} ({who}: {relpath} is there)"


def release_worker(store: Store, worker: str, token: str, prune: tuple[str, ...] = ()) -> None:
    """Drop our claim of ``worker``: made under a name the process turned out not to have, or no longer
    needed (the run is finished, and its end-of-job marker protects it). ``prune``: local folders
    (relative, "" the run itself) to remove too if that left them empty."""
    relpath = layout.writer_claim_path(worker)
    try:
        if json.loads(store.read_bytes(relpath)).get("token") == token:
            store.remove(relpath)
    except (OSError, ValueError, AttributeError):
        pass
    if store.is_local:
        for folder in (layout.WRITERS_DIR, *prune):
            try:
                os.rmdir(f"{store.root}/{folder}" if folder else store.root)
            except OSError:  # not empty, or not there
                pass


class OutDirCheck:
    """The check of an out_dir (an earlier run, another writer of this worker) and the claim of the
    worker's name, made on a thread of its own when a hook is created: the hook waits for it at most a
    few seconds, so an unreachable store never holds training up. When it does not finish in time, the
    writer makes the claim before it writes anything (and writes nothing if the name is taken)."""

    def __init__(self, open_store: Callable[[], Store], worker: str | None, claim: bool, uri: str = ""):
        self.worker = worker
        self.token = uuid.uuid4().hex
        self.store: Store | None = None
        self.found: str | None = None  # what the out_dir already holds that refuses this hook
        self.claimed = False
        self.in_use = False  # a writer took the claim over
        self.created_run = False  # the claim created the (local) run folder
        self.error: BaseException | None = None
        self._open_store = open_store
        self._claim = claim and worker is not None
        self._done = threading.Event()
        self._settled = threading.Event()  # done, or the store's endpoint refuses connections
        self.unreachable: str | None = None  # why the endpoint cannot be reached (then no one waits)
        # probed at once when the URI tells where (opening the store imports its filesystem: seconds)
        self._address = _endpoint_address(uri=uri)
        if self._address is not None:
            threading.Thread(target=self._probe, name="smdebug-out-dir-probe", daemon=True).start()
        threading.Thread(target=self._run, name="smdebug-out-dir-check", daemon=True).start()

    def _run(self) -> None:
        try:
            self.store = self._open_store()
            if not self.store.is_local and self._address is None:
                self._address = _endpoint_address(self.store)
                threading.Thread(target=self._probe, name="smdebug-out-dir-probe", daemon=True).start()
            self.found = existing_run(self.store, self.worker)
            # a hook that went on without this check (its store's endpoint was down) claims the name when
            # its writer first writes, never from here later on: a hook created meanwhile, once the store
            # is back, would otherwise be refused for a claim no one was waiting for
            if self.found is None and self._claim and self.unreachable is None:
                self.created_run = self.store.is_local and not os.path.isdir(self.store.root)
                self.found = claim_worker(self.store, self.worker, self.token)
                self.claimed = self.found is None
        except Exception as exc:  # an unreachable location: the writer claims the run when it can
            self.error = exc
        finally:
            self._done.set()
            self._settled.set()

    def _probe(self) -> None:
        """A remote store's endpoint that refuses connections (down from the start) is not waited for:
        its client would retry for seconds on the training thread's time. One TCP connection tells."""
        address = self._address
        if address is None:
            return
        try:
            socket.create_connection(address, timeout=PROBE_SECONDS).close()
        except OSError as exc:
            if not self._done.is_set():
                self.unreachable = f"{address[0]}:{address[1]}: {type(exc).__name__}: {exc}"
                self._settled.set()

    def wait(self, timeout: float) -> bool:
        """Whether the check finished within ``timeout`` seconds (False at once when the store's
        endpoint cannot be reached: the check goes on in the background, the writer claims the run)."""
        self._settled.wait(timeout)
        return self._done.is_set()

    def release_if_unused(self) -> None:
        """A hook that never wrote leaves nothing behind: its claim goes (and the run folder the claim
        created). Bounded: at most the check timeout."""
        if not self.claimed or self.in_use or not self._done.is_set():
            return
        self.claimed = False
        prune = ("",) if self.created_run else ()
        try:
            run_bounded(
                lambda: release_worker(self.store, self.worker, self.token, prune), check_timeout_from_env()
            )
        except Exception as exc:
            logger.debug("smdebug: could not release the claim of %s: %s", self.worker, exc)


class WorkerClaimed(OutDirExistsError):
    """Another writer holds this worker's name in the run (found by the writer, after the hook started)."""


class ClaimPublication:
    """The claim of the writer's worker name, published before anything else."""

    step = None
    file = None
    memory = 0

    def __init__(self, worker: str, token: str, release: str | None = None):
        self.worker, self.token, self.release = worker, token, release
        self.what = f"the claim of {worker}"

    def publish(self, store: Store) -> None:
        if self.release and self.release != self.worker:
            release_worker(store, self.release, self.token)
        found = existing_run(store, self.worker) or claim_worker(store, self.worker, self.token)
        if found:
            raise WorkerClaimed(found)

    def in_memory(self) -> int:
        return 0

    def spill(self) -> None:
        pass

    def discard(self) -> None:
        pass


def claims_name(worker: str | None, every_worker_writes: bool) -> bool:
    """Whether a new hook of ``worker`` claims the name at creation. A worker launched as one of several
    may not know its rank yet (the default name then is not its own): its writer claims the name it has
    when it first writes."""
    if worker is None:
        return False
    if worker == DEFAULT_WORKER:
        return not one_of_many_workers()
    return every_worker_writes


def check_out_dir(uri: str, open_store: Callable[[], Store], worker: str | None, claim: bool) -> OutDirCheck:
    """Refuse an out_dir that already holds a run, or that another writer of this worker is writing (no
    silent mixing of two runs): OutDirExistsError. The workers of one distributed run share it: files of
    other workers are fine, this worker's own are not. The check claims the worker's name in the run
    (atomically: of two writers starting together one is refused); it runs on a thread of its own and is
    waited for at most SMDEBUG_CHECK_TIMEOUT seconds, so an unreachable store never holds training up (the
    writer then claims the name before it writes anything)."""
    check = OutDirCheck(open_store, worker, claim, uri)
    # a hook that never writes leaves nothing behind (an activated hook a script's own replaces)
    at_exit(check.release_if_unused)
    timeout = check_timeout_from_env()
    if not check.wait(timeout):
        logger.warning(
            "smdebug: %s %s; training goes on, and the run is checked before anything is written to it",
            redact(uri),
            f"cannot be reached ({check.unreachable})"
            if check.unreachable
            else f"did not answer within {timeout:g} s",
        )
    elif check.store is None and isinstance(check.error, (ValueError, ImportError)):
        # no filesystem takes this URI ("S3://...", s3fs not installed): nothing could ever be saved
        why = (
            check.error
            if isinstance(check.error, SMDebugError)
            else f"cannot open {redact(uri)}: {check.error}"
        )
        raise ConfigError(f"out_dir: {redact(str(why))}") from None
    elif check.store is not None and refuses_writes(check.store, check.error):
        # retrying could never succeed: said now, not after training and a close timeout of retries
        raise ConfigError(f"out_dir: cannot write to {redact(uri)}: {check.store.describe(check.error)}")
    elif check.error is not None:  # an unreachable location is reported when writing, not here
        logger.debug("smdebug: could not check %s: %s", redact(uri), type(check.error).__name__)
    elif check.found:
        raise OutDirExistsError(
            f"out_dir: {redact(uri)} already holds {check.found}; smdebug does not mix two runs "
            "in one directory: choose a new out_dir"
        )
    return check


def refuses_writes(store: Store, error: BaseException | None) -> bool:
    """Whether a local out_dir can never be written (permission denied, a read-only file system). A remote
    store's refusals are retried: a bucket may appear late, a new role's access may take a while."""
    return (
        store.is_local
        and isinstance(error, OSError)
        and error.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
    )


def writer_claim(check: OutDirCheck | None, worker: str) -> tuple[Store | None, tuple | None, str | None]:
    """What a hook's writer starts from: the store the check opened (or None), the claim it still has to
    make ``(token, name claimed at creation or None)`` (None when the check's claim is its own already),
    and the claim's token. The check's claim is the writer's from now on."""
    if check is None:
        return None, None, None
    check.in_use = True
    claim = None
    if not (check.claimed and check.worker == worker):
        claim = (check.token, check.worker if check.claimed else None)
    return check.store, claim, check.token
