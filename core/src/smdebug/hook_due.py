"""Deciding what the hook saves (a part of BaseHook): the collections due at a step, the collections a
tensor belongs to (cached), the idle steps where nothing is due, the collections' effective configs, and
what saving a tensor means for its due collections (its plan: reductions, raw value, shape)."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from smdebug.collection import INPUT_SUFFIX, OUTPUT_SUFFIX, Collection, CollectionKeys
from smdebug.config import ReductionConfig, edits
from smdebug.exceptions import did_you_mean
from smdebug.hook_helpers import close_at_exit
from smdebug.modes import ModeKeys
from smdebug.reductions import reduction_tensor_name
from smdebug.writing.bounded import at_exit


class DuePlanning:
    """BaseHook's planning of what is due; it uses the hook's collections, options and step state."""

    def anything_due(self) -> bool:
        """Whether any collection is due at this step (False outside a step): the cheap first test."""
        return self._in_step and bool(self._due) and self.writing

    def is_due(self, name: str) -> bool:
        """Whether a tensor of this name would be saved at the current step (cheap, cached)."""
        return self.anything_due() and not self._due.isdisjoint(self.collections_of(name))

    def any_due(self, names: Sequence[str]) -> bool:
        """Whether a tensor of any of these names would be saved at this step. Cached for the same
        sequence object (a model's parameter names, asked at every step) while the due collections and
        the collections stay the same."""
        if not self.anything_due():
            return False
        due = self._due
        known = self._any_due.get(id(names))
        if known is None or known[0] is not names or known[1] is not due:
            found = any(not due.isdisjoint(self.collections_of(name)) for name in names)
            known = self._any_due[id(names)] = (names, due, found)  # holding names keeps its id unique
        return known[2]

    def has_due_collection(self, *names: str) -> bool:
        return self.anything_due() and any(c.name in names for c in self._due)

    @property
    def due_collections(self) -> frozenset[Collection]:
        """The collections due at this step (empty outside a step)."""
        return self._due if self._in_step else frozenset()

    def collections_of(self, name: str) -> frozenset[Collection]:
        """The included collections a tensor of this name belongs to (cached)."""
        found = self._colls_of.get(name)
        if found is None:
            found = frozenset(c for c in self._included() if c.matches(name))
            self._colls_of[name] = found
        return found

    def layer_wanted(self, layer: str) -> bool:
        """Whether an included collection may hold a layer's inputs or outputs, asked with the names of
        its first call in a step (``<layer>_input_0``, ``<layer>_output_0``): the layers worth a callback."""
        return bool(
            self.collections_of(f"{layer}{INPUT_SUFFIX}0") or self.collections_of(f"{layer}{OUTPUT_SUFFIX}0")
        )

    def collections_changed(self) -> None:
        """Collections (or what ``prepare_collections`` resolves) changed: prepare them again."""
        self._prepared = False
        self._forget_matches()

    def _forget_matches(self) -> None:
        self._colls_of.clear()
        self._any_due.clear()
        self._span = ()
        self.collections_version += 1

    def _include(self, name: str) -> None:
        if name not in self.include_collections:
            self.include_collections.append(name)
            self._prepared = False

    def _included(self) -> list[Collection]:
        collections = self.collection_manager.collections
        if CollectionKeys.ALL in self.include_collections:
            return list(collections.values())
        # _prepare created every included collection; not get_collection, which empties _colls_of
        return [collections[n] for n in self.include_collections if n in collections]

    def _close_at_exit(self) -> None:
        """Training started (here, or in the workers the hook was shipped to): the run is finished at
        exit at the latest."""
        if self._closed_at_exit is None:
            self._closed_at_exit = weakref.ref(self)
            at_exit(close_at_exit, self._closed_at_exit, None)

    def _prepare(self) -> None:
        """Give every collection its effective configs (its own, completed by the hook's)."""
        self._close_at_exit()
        self.worker = self.worker_name()
        self.prepare_collections()
        for name in self.include_collections:
            self.collection_manager.get(name, cls=self.collection_class)
        for coll in self.collection_manager.collections.values():
            coll.save_config.merge_default_save_config(self.save_config)
            if coll.name in self.scalar_collections:
                coll.reduction_config = ReductionConfig(save_raw_tensor=True)
                coll.save_histogram = False
            elif coll.reduction_config is None:
                coll.reduction_config = self.reduction_config
        for coll in self._included():
            if coll.name not in self.builtin_collections and not (coll.include_regex or coll.tensor_names):
                known = [  # (not another empty one: 'inputs' is no better a guess for 'outputs')
                    *self.builtin_collections,
                    *self.builtin_patterns,
                    *(
                        n
                        for n, c in self.collection_manager.collections.items()
                        if c.include_regex or c.tensor_names
                    ),
                ]
                self.warn_once(
                    f"empty:{coll.name}",
                    "smdebug: collection %r has no include_regex or tensor names: it saves only what "
                    "save_tensor adds to it%s",
                    coll.name,
                    did_you_mean(coll.name, [n for n in known if n != coll.name]),
                )
        self._forget_matches()
        self._prepared = True

    def _collections_due(self) -> frozenset[Collection]:
        mode, step = self.mode, self.mode_step
        span = self._span
        if span and span[0] == edits[0] and span[1] is mode and span[2] <= step < span[3]:
            return span[4]  # (every step of a save_interval=1 run: no configuration asked again)
        skipped = self.train_only_collections if mode in (ModeKeys.EVAL, ModeKeys.PREDICT) else ()
        configs = [
            (c, c.save_config.get_save_config(mode)) for c in self._included() if c.name not in skipped
        ]
        due = frozenset(c for c, cfg in configs if cfg.should_save_step(step))
        # the following steps where the same collections are due: until the first config changes its answer
        changes = (cfg.saves_until(step) if c in due else cfg.next_save_step(step + 1) for c, cfg in configs)
        end = min((n for n in changes if n is not None), default=float("inf"))
        self._span = (edits[0], mode, step, end, due)
        return due

    def _idle_at(self, mode_step: int) -> bool:
        """Whether nothing is due at this mode step, as _collections_due found last, nothing changed."""
        span = self._span
        return (
            bool(span)
            and not span[4]
            and span[0] == edits[0]
            and span[1] is self.mode
            and span[2] <= mode_step < span[3]
        )

    # -- a tensor's plan ----------------------------------------------------------------------------
    def _due_plan(self, name: str, value: Any) -> tuple | None:
        """The plan of a tensor due at this step (cached, see _plan), None when it is not due; a due
        tensor's name is recorded in its collections."""
        colls = self._colls_of.get(name)
        if colls is None:
            colls = self.collections_of(name)
        due = self._due
        plan = self._plans.get(name)
        if plan is None or plan[0] is not colls or plan[1] is not due:
            if due.isdisjoint(colls):
                return None
            plan = self._plans[name] = (colls, due, self._plan(name, value, due.intersection(colls)))
            for coll in colls:
                coll.add_tensor_name(name)
        return plan[2]

    def plan_for(self, name: str) -> tuple[tuple[tuple[str, bool], ...], bool] | None:
        """(reduction pairs, whether the value is saved) of a numeric tensor of this name due at this
        step, None when it is not due: asked on every worker, writing or not (include_workers), for the
        workers of a sharded tensor combine its reductions together and each must take part."""
        if not (self._in_step and self._due):
            return None
        plan = self._due_plan(name, None)
        return None if plan is None else (plan[0], plan[2] or plan[3])

    def _plan(self, name: str, value: Any, colls: Iterable[Collection]) -> tuple:
        """What saving a tensor means for these collections: (reduction pairs, their tensor names, raw,
        shape, a TensorBoard histogram of a value not saved raw); a text tensor is saved raw only. Cached
        per tensor name while its collections and the due collections stay the same objects
        (save_for_step)."""
        colls = list(colls)
        numeric = not (isinstance(value, np.ndarray) and value.dtype.kind in "USO")  # text: raw only
        pairs = tuple(
            {
                pair: None
                for c in colls
                if numeric and c.name not in self.scalar_collections
                for pair in c.reduction_config.reduction_pairs()
            }
        )
        names = [reduction_tensor_name(name, r, a, self.reduction_names_keep_index) for r, a in pairs]
        raw = not numeric or any(c.reduction_config.save_raw_tensor for c in colls)
        shape = any(c.reduction_config.save_shape for c in colls)
        # reductions only, exported to TensorBoard: the histogram of the value all the same (as 1.0)
        histogram = (
            numeric
            and not raw
            and self.tensorboard_dir is not None
            and not self.dry_run
            and any(c.save_histogram and c.name not in self.scalar_collections for c in colls)
        )
        return pairs, names, raw, shape, histogram
