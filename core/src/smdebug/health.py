"""Always-on training health: a flight recorder of every step's statistics, its triggers, and the record
of the first non-finite value.

A framework plugin computes, at every step, the l2 norm and the max |x| of every tracked tensor (each
parameter's weight and gradient, the loss) in a few batched device calls, into one row of a ring buffer
it allocated on the tensors' device (``HealthMonitor.track``). The monitor keeps the rows' steps on the
host and checks each row (a host copy, possibly a step late) for a non-finite value and for a loss spike.
Nothing is written while the run is healthy; when a trigger fires (a non-finite value, a loss spike, an
in-training rule, an uncaught exception, SIGTERM or SIGINT) the recorded rows are written to the run at
the end of the step as ordinary reductions of their own steps (``smdebug/reductions/l2/<name>`` and
``smdebug/reductions/abs_max/<name>``), which any reader of smdebug runs reads.

The first non-finite value's provenance (found by the plugin: input batch, a module's forward output, the
loss, or a parameter's gradient) and the triggers go to ``health/<worker>.json`` in the run, a folder
smdebug 1.0's reader never lists.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from smdebug import plugins
from smdebug.layout import worker_from_file_name
from smdebug.modes import ModeKeys
from smdebug.reductions import reduction_tensor_name

if TYPE_CHECKING:
    from smdebug.hook import BaseHook

logger = logging.getLogger("smdebug")

HEALTH_DIR = "health"
DIRECTIONS = ("input", "forward", "loss", "backward")  # the order in which a step computes them
UNTRAINED = (ModeKeys.EVAL, ModeKeys.PREDICT)  # modes whose loss is no spike: validation is not training
DEFAULT_STEPS = 100
DEFAULT_LOSS_FACTOR = 10.0
MIN_LOSS_HISTORY = 5  # steps of loss seen before a spike can be judged
LOSS_WINDOW = 50  # the recent steps whose median loss a spike is judged against
MEDIAN_EVERY = 10  # steps between two computations of that median
ABSENT = -1.0  # a row's value for a tensor the step did not have (no gradient): norms are never negative


def health_record_path(worker: str) -> str:
    return f"{HEALTH_DIR}/{worker}.json"


class HealthMonitor:
    """One hook's flight recorder and triggers (``hook.health`` when the hook has ``health=True``).

    A plugin calls, at every step: ``track(names, loss_name, make_buffer)`` when the set of tensors it
    watches changes (the buffer it makes holds ``steps`` rows of ``2 * len(names)`` float32 values: the
    l2 norms, then the max |x|), ``row()`` for the slot of the current step, then ``check(slot, host)``
    with the host copy of that row once it has one. ``check`` returns True when the row holds the run's
    first non-finite value: the plugin then finds where it came from and calls ``found(record)``.
    """

    def __init__(self, hook: BaseHook, steps: int = DEFAULT_STEPS, loss_factor: float = DEFAULT_LOSS_FACTOR):
        self.hook = hook
        self.capacity = int(steps)
        self.loss_factor = float(loss_factor)
        self.names: tuple[str, ...] = ()
        self.buffer: Any = None
        self._loss_col: int | None = None
        # each slot's step, mode, mode step, whether the hook wrote something at that step, whether the row
        # is written, its loss: Python lists (a numpy scalar's reading or writing runs far more code, and
        # a step runs these with its caches cold)
        n = self.capacity
        self._steps: list[int] = [-1] * n
        self._modes: list[Any] = [None] * n
        self._mode_steps: list[int] = [0] * n
        self._written: list[bool] = [False] * n
        self._dumped: list[bool] = [False] * n
        # the last training losses judged, (step, loss): kept apart from the ring, whose length
        # (health_steps, 1 allowed) must not decide whether a spike can be judged
        self._losses: deque[tuple[int, float]] = deque(maxlen=LOSS_WINDOW)
        self._next = 0
        self._seen = 0
        self._median: float | None = None
        self._last_slot: int | None = None
        self.first_nonfinite: dict | None = None
        self.triggers: list[dict] = []
        self._pending: list[str] = []
        self._save_row: tuple[int, np.ndarray] | None = None  # the current save step's row, to write
        self._last_spike = -(1 << 62)
        self._rules_seen = 0
        self._record_written = False
        self._installed: dict[int, Any] = {}
        self._excepthook = None
        self._install()

    # -- what the plugin calls -------------------------------------------------------------------------
    def track(self, names: Sequence[str], loss_name: str | None, make_buffer) -> Any:
        """Watch these tensors from now on (the loss, if any, among them): a new buffer from
        ``make_buffer(rows, columns)``; the rows recorded so far are written first if a trigger awaits."""
        if self.buffer is not None and (names is self.names or tuple(names) == self.names):
            return self.buffer
        names = tuple(names)
        self.buffer = make_buffer(self.capacity, 2 * len(names))
        self.names = names
        self._loss_col = names.index(loss_name) if loss_name in names else None
        self._steps = [-1] * self.capacity
        self._dumped = [False] * self.capacity
        keep = self.hook.reduction_names_keep_index  # (as the hook names its other reductions)
        self._l2_names = [reduction_tensor_name(n, "l2", False, keep) for n in names]
        self._max_names = [reduction_tensor_name(n, "max", True, keep) for n in names]
        logger.info(
            "smdebug: health recorder: last %d steps of %d tensors, %s",
            self.capacity,
            len(names),
            self.memory(),
        )
        return self.buffer

    def memory(self) -> str:
        """What the recorder holds where the tensors live (float32 values), as text."""
        nbytes = self.capacity * 2 * len(self.names) * 4
        if nbytes < 1 << 10:
            return f"{nbytes} B"
        return f"{nbytes / 1024:.0f} KiB" if nbytes < 1 << 20 else f"{nbytes / (1 << 20):.1f} MiB"

    def row(self) -> int:
        """The ring slot of the hook's current step (the oldest row makes room)."""
        hook = self.hook
        slot = self._next
        self._next = (slot + 1) % self.capacity
        self._steps[slot] = hook.step
        self._modes[slot] = hook.mode
        self._mode_steps[slot] = hook.mode_step
        self._written[slot] = False
        self._dumped[slot] = False
        self._last_slot = slot
        return slot

    def check(self, slot: int, host: np.ndarray, skipped: bool = False, finite: bool | None = None) -> bool:
        """Judge a recorded row (its host copy): True when it holds a non-finite value and none was found
        yet (the plugin then calls ``found``, or waits for a later row: gradients no optimizer applied); a
        loss spike sets a trigger. ``skipped``: the row's non-finite values made the optimizer skip its
        update by design (a loss scaler's overflow): not a fault. ``finite``: whether every value of the
        row is, when the plugin knows (its kernel looked at each): not looked at again."""
        n = len(self.names)
        hook = self.hook
        if hook.anything_due() and self._steps[slot] == hook.step:  # a save step: its statistics too,
            self._save_row = (slot, np.array(host))  # written when the hook ends the step (save_row)
        # non-finite if any max |x| is: their dot product is (one BLAS call: numpy's reductions, or Python
        # floats made of every value, run more code than the reading); in float64, where no finite
        # float32's square overflows (numpy would warn the user about a value that is no fault)
        if finite is None:
            maxes = host[n:].astype(np.float64)
            total = float(maxes.dot(maxes))
            finite = total - total == 0 or bool(np.isfinite(maxes).all())
        if not finite and not skipped:
            return self.first_nonfinite is None
        col = self._loss_col
        loss = -1.0 if col is None else host.item(col)
        if loss >= 0 and self._modes[slot] not in UNTRAINED:  # (NaN: no loss that step)
            step = self._steps[slot]
            # the median is computed again only every few steps, or when this loss looks like a spike
            # (and at every step until there is one: a spike after MIN_LOSS_HISTORY steps is judged)
            self._seen += 1
            if (
                self._median is None
                or self._seen % MEDIAN_EVERY == 0
                or loss > self.loss_factor * self._median
            ):
                self._median = self._recent_median()
            median = self._median
            if (
                median is not None
                and median > 0
                and loss > self.loss_factor * median
                and step - self._last_spike >= self.capacity
            ):
                self._last_spike = step
                self.trigger(
                    f"loss spike: {loss:.4g} is {loss / median:.1f}x the recent median {median:.4g}",
                    step=step,
                )
            losses = self._losses
            if losses and losses[-1][0] == step:  # (the step recorded again: another optimizer's)
                losses[-1] = (step, loss)
            else:
                losses.append((step, loss))
        return False

    def _recent_median(self) -> float | None:
        """The median loss of the last LOSS_WINDOW training steps judged, None before MIN_LOSS_HISTORY."""
        recent = sorted(loss for _, loss in self._losses)
        count = len(recent)
        if count < MIN_LOSS_HISTORY:
            return None
        half = count // 2  # (np.median's value, without its cost: a tenth of a small step's)
        return recent[half] if count % 2 else (recent[half - 1] + recent[half]) / 2

    def nonfinite_names(self, host: np.ndarray) -> list[str]:
        """The tracked tensors holding a non-finite value in a row, in tracking order."""
        n = len(self.names)
        return [self.names[i] for i in np.flatnonzero(~np.isfinite(host[n:]))]

    def found(self, record: dict) -> None:
        """The provenance of the run's first non-finite value (``step``, ``mode``, ``direction``, ``module``,
        ``tensor`` at least): recorded, and a trigger."""
        hook = self.hook
        record = {"worker": hook.worker, **record}
        if hasattr(record.get("mode"), "name"):  # a ModeKeys
            record["mode"] = record["mode"].name
        self.first_nonfinite = record
        where = f"{record.get('direction')} {record.get('tensor')}"
        logger.warning(
            "smdebug: first non-finite value at step %s (%s) on %s: %s",
            record.get("step"),
            record.get("mode"),
            worker_from_file_name(str(record.get("worker"))),  # (as the Trial and `smdebug why` name it)
            where,
        )
        self.trigger(f"non-finite value: {where}", step=record.get("step"))

    def trigger(self, reason: str, step: int | None = None) -> None:
        """Write the recorder to the run at the end of the current step (now, outside a step)."""
        hook = self.hook
        self.triggers.append(
            {"step": hook.step if step is None else int(step), "mode": hook.mode.name, "reason": reason}
        )
        self._pending.append(reason)
        if not hook.in_step:
            self.write()

    @property
    def pending(self) -> bool:
        """A trigger awaits the end of the step (the plugin must end it through ``end_step``)."""
        return bool(self._pending)

    # -- what the core hook calls ----------------------------------------------------------------------
    def step_ended(self, wrote: bool) -> None:
        """The hook ended its step (and ran its rules): note whether the step wrote anything, see whether
        a rule fired, and write the recorder if a trigger awaits."""
        slot = self._last_slot
        if slot is not None and self._steps[slot] == self.hook.step:
            self._written[slot] = wrote
        results = self.hook.rule_results
        if len(results) > self._rules_seen:
            fired = results[self._rules_seen :]
            self._rules_seen = len(results)
            for result in fired:
                why = f": {result.reason}" if result.reason else ""
                self.trigger(f"rule {result.rule} fired{why}", step=result.step)
        if self._pending:
            self.write()

    def save_row(self) -> None:
        """A save step ends: its row goes with the hook's own tensors (which the hook has queued: where
        it reduced a tensor as the recorder does, its own value stays, once)."""
        if self._save_row is not None:
            (slot, host), self._save_row = self._save_row, None
            hook = self.hook
            if self._steps[slot] == hook.step:
                with hook.guard("save the step's health statistics"):
                    self._write_row(slot, host, hook._writer or hook._get_writer(), time.time())

    def write(self) -> None:
        """Write the rows not yet written as reductions of their steps, and the health record."""
        self._pending.clear()
        hook = self.hook
        with hook.guard("write the health recorder"):
            self._write_rows()
        with hook.guard("write the health record"):
            self._write_record()

    def close(self) -> None:
        """The hook closes: its health record goes to the run; signal handlers are given back."""
        self._uninstall()
        self.raised()
        if self._pending:
            self.write()
        elif not self._record_written:
            with self.hook.guard("write the health record"):
                self._write_record()

    # -- writing ---------------------------------------------------------------------------------------
    def _write_rows(self) -> None:
        hook = self.hook
        if self.buffer is None or not hook.writing:
            return
        current = hook.step
        steps = self._steps
        slots = [
            s
            for s in sorted(range(len(steps)), key=steps.__getitem__)
            if self._steps[s] >= 0
            and not self._dumped[s]
            # a step the hook wrote has its files: only the one just ended can take more (the writer
            # reopens it); older ones keep what they saved
            and (not self._written[s] or self._steps[s] == current)
        ]
        if not slots:
            return
        # the step just ended first: the writer appends to it before any other step is opened
        slots.sort(key=lambda s: (self._steps[s] != current, self._steps[s]))
        host = np.asarray(plugins.to_numpy(self.buffer), dtype=np.float32)
        writer = hook._writer or hook._get_writer()
        now = time.time()
        for slot in slots:
            self._write_row(slot, host[slot], writer, now)
            writer.end_step(int(self._steps[slot]))

    def _write_row(self, slot: int, values: np.ndarray, writer, now: float) -> None:
        """A recorded row as the reductions of its step (the tensors the step had)."""
        n = len(self.names)
        present = np.flatnonzero(values[:n] != ABSENT)  # (NaN is present)
        step = int(self._steps[slot])
        hook = self.hook
        due = hook._due
        if due and step == hook.step:  # a save step: a tensor it saves is its own record, whole (under
            # DDP, say, it saves each rank's gradient before the all-reduce, the recorder the averaged one)
            present = [i for i in present if due.isdisjoint(hook.collections_of(self.names[i]))]
        names = [self._l2_names[i] for i in present] + [self._max_names[i] for i in present]
        data = np.concatenate([values[:n][present], values[n:][present]]).astype(np.float32)
        reduced_step, reduced = hook._reduced
        if reduced_step == step and reduced:  # a save step: the hook's own reductions stay, once
            done = {name for some in reduced for name in some}
            keep = [i for i, name in enumerate(names) if name not in done]
            names, data = [names[i] for i in keep], data[keep]
        if names:
            writer.write_scalars(step, self._modes[slot], int(self._mode_steps[slot]), [names], [data], now)
        self._dumped[slot] = True

    def _write_record(self) -> None:
        hook = self.hook
        # a restarted job's run: what its earlier job recorded up to the checkpoint comes first
        earlier = hook.checkpoints.records_before.get("health", {}) if hook.checkpoints is not None else {}
        record = {
            "worker": hook.worker,
            "first_nonfinite": earlier.get("first_nonfinite") or self.first_nonfinite,
            "triggers": [*earlier.get("triggers", []), *self.triggers],
            "recorder": {"steps": self.capacity, "tensors": len(self.names), "memory": self.memory()},
        }
        data = json.dumps(record, indent=1).encode()
        path = health_record_path(hook.worker)
        if hook.writing:
            (hook._writer or hook._get_writer()).write_file(path, data)
        elif not hook.dry_run:  # a worker that saves no tensors still says what went wrong on it
            from smdebug.writing.bounded import run_bounded

            run_bounded(lambda: plugins.open_store(hook.out_dir).write_bytes(path, data))
        self._record_written = True

    # -- signals and uncaught exceptions ---------------------------------------------------------------
    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._pid = os.getpid()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                # an ignored signal stays ignored (a shell script's background job ignores SIGINT): it
                # ends nothing, so it is no trigger
                if signal.getsignal(sig) != signal.SIG_IGN:
                    self._installed[sig] = signal.signal(sig, self._on_signal)
            except (ValueError, OSError):  # not settable here (an embedded interpreter)
                pass
        self._excepthook = sys.excepthook
        sys.excepthook = self._on_exception

    def _uninstall(self) -> None:
        for sig, previous in self._installed.items():
            try:
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, previous)
            except (ValueError, OSError):
                pass
        self._installed = {}
        if self._excepthook is not None and sys.excepthook == self._on_exception:
            sys.excepthook = self._excepthook
        self._excepthook = None

    def _on_signal(self, signum, frame) -> None:
        previous = self._installed.get(signum, signal.SIG_DFL)
        name = signal.Signals(signum).name
        hook = self.hook
        # (a forked copy, such as a data loader's worker, has the handler too: its recorder is not the
        # run's, and its record would replace the run's)
        if os.getpid() == self._pid:
            try:
                self._pending.append(name)
                self.triggers.append({"step": hook.step, "mode": hook.mode.name, "reason": f"signal {name}"})
                if signum == signal.SIGTERM:
                    hook.close()  # the process ends: the run is finished, the recorder in it
                else:
                    if hook.in_step:
                        hook.end_step()
                    if self._pending:
                        self.write()
                    hook.flush()
            except Exception as exc:  # never stand in the way of the signal
                logger.warning("smdebug: could not write the health recorder on %s: %s", name, exc)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def raised(self, reason: str | None = None) -> bool:
        """An exception propagating now (the hook closes in try/finally or an except clause) is a trigger,
        once a step: close calls it, and a plugin that saves the step's tensors on a trigger before that.
        ``reason``: a plugin's own words for a failure it saw (no exception need be in flight then).
        True when this added the trigger."""
        if reason is None:
            kind, value, _ = sys.exc_info()
            if value is None or not _a_failure(value):
                return False
            reason = f"training raised {kind.__name__}: {value}"
        if self._raised_seen():
            return False
        self.trigger(reason)
        return True

    def _raised_seen(self) -> bool:
        """An exception of this step is a trigger already (a plugin, or close, may see it first; a
        KeyboardInterrupt follows SIGINT)."""
        step = self.hook.step
        return any(
            t["step"] == step and t["reason"].startswith(("training raised", "signal")) for t in self.triggers
        )

    def _on_exception(self, kind, value, tb) -> None:
        previous = self._excepthook or sys.__excepthook__
        try:
            if not self.hook.closed:
                self.raised(f"training raised {kind.__name__}: {value}")
                self.hook.close()
        except Exception as exc:
            logger.warning("smdebug: could not write the health recorder: %s", exc)
        previous(kind, value, tb)


def _a_failure(exc: BaseException) -> bool:
    """Whether an exception ends training by failing: not a rule's StopTraining (its firing is a trigger
    already), nor a clean exit."""
    from smdebug.exceptions import StopTraining

    if isinstance(exc, SystemExit):
        return exc.code not in (None, 0)
    return not isinstance(exc, (StopTraining, GeneratorExit))


def first_nonfinite(records: Sequence[dict]) -> dict | None:
    """The earliest first non-finite value of the workers' health records: the lowest step, then the
    earliest place in a step (input, forward, loss, backward), then the worker."""
    found = [r["first_nonfinite"] for r in records if isinstance(r.get("first_nonfinite"), dict)]
    if not found:
        return None

    def key(rec):
        direction = rec.get("direction")
        order = DIRECTIONS.index(direction) if direction in DIRECTIONS else len(DIRECTIONS)
        return (int(rec.get("step", 0)), order, str(rec.get("worker", "")))

    return dict(min(found, key=key))
