"""The hook's side of writing (a part of BaseHook): the out_dir check, the writer (opened when the hook
first saves, through smdebug.writing's factory), the run's collections and tensor-notes files, and what
observers may ask of it (the steps written, the steps that could not be saved)."""

from __future__ import annotations

import json
import weakref

from smdebug import layout, open_runs, plugins
from smdebug.hook_helpers import close_at_exit
from smdebug.layout import collections_file_path
from smdebug.writing import Writer, open_writer
from smdebug.writing.bounded import at_exit
from smdebug.writing.ownership import check_out_dir, claims_name, writer_claim


class HookOutput:
    """BaseHook's writing plumbing; it uses the hook's out_dir, worker, options and collections."""

    _writer: Writer | None = None

    # -- what was written (for observers: the rule runner) ------------------------------------------
    @property
    def written_steps(self) -> list[int]:
        """The steps written to the run so far, in order."""
        return self._writer.written_steps if self._writer is not None else []

    @property
    def failed_steps(self) -> dict[int, str]:
        """The steps that could not be saved, and why."""
        return self._writer.failed_steps if self._writer is not None else {}

    def wait_for_writer(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until everything queued is written, or waits for a failing
        store to come back; False when it had to stop waiting."""
        return self._writer is None or self._writer.flush(timeout)

    def _get_writer(self) -> Writer:
        if self._writer is None:
            # The store is opened and the run claimed on the writer's threads, never on this one.
            store, claim, token = writer_claim(getattr(self, "_out_dir_check", None), self.worker)
            self._writer = open_writer(
                self.out_dir,
                self.worker,
                store,
                lambda: plugins.open_store(self.out_dir),
                self.max_queue_bytes,
                claim=claim,
                claim_token=token,
            )
            # a restarted job's run: the steps its earlier job could not save stay recorded
            earlier = self.checkpoints.records_before.get("unsaved") if self.checkpoints is not None else None
            if earlier:
                self._writer.failed_steps.update(earlier)
            at_exit(close_at_exit, weakref.ref(self), self._writer)  # flush before thread pools stop
            open_runs.register(self.out_dir, self)  # a Trial opened in this process flushes us first
        return self._writer

    def _export_collections(self) -> None:
        if self._writer is None or not self.writing:
            return
        num_workers = self.num_workers() if self.include_workers == "all" else 1
        self.collection_manager.meta["num_workers"] = num_workers
        data = json.dumps(self.collection_manager.to_json_dict()).encode()
        self._writer.write_file(collections_file_path(self.worker), data)
        self._collections_exported = True
        self._export_notes()

    def _export_notes(self) -> None:
        """The run's tensor notes of this worker, when there is anything to note (none in most runs)."""
        if not (self._placements or self._unsaved_tensors) or not self.writing:
            return
        self._notes_changed = False
        notes = layout.encode_notes(self.worker, self._placements, self._unsaved_tensors)
        (self._writer or self._get_writer()).write_file(layout.tensor_notes_path(self.worker), notes)

    def _check_out_dir(self) -> None:
        """Refuse an out_dir that already holds a run, or that another writer of this worker is writing
        (smdebug.writing.ownership.check_out_dir); nothing to check in a dry run."""
        self._out_dir_check = None
        if self.dry_run:
            return
        try:
            worker = self.worker_name()
        except Exception:  # a plugin not initialised yet: only a finished run can be recognised
            worker = None
        claim = claims_name(worker, self.include_workers == "all")
        self._out_dir_check = check_out_dir(
            self.out_dir, lambda: plugins.open_store(self.out_dir), worker, claim
        )
