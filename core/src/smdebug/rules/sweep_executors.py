"""Where a sweep's tasks run (smdebug.rules.sweep): in this process, each run's tasks right after its plan,
or on a Dask cluster (a LocalCluster the sweep starts, or a scheduler's address)."""

from __future__ import annotations

import logging
import os
import warnings

from smdebug.exceptions import SMDebugValueError
from smdebug.rules.sweep_tasks import (
    cancel_event_name,
    describe_error,
    error_result,
    evaluate_batch,
    forget_trials,
    plan_and_evaluate,
    plan_run,
)

DASK_HINT = "pip install 'smdebug-core[dask]'"


class SerialExecutor:
    """A run's tasks right after its plan, while its trial is at hand."""

    def __init__(self):
        self._done = []

    def map_plans(self, sweep_id, paths, job):
        for i, path in enumerate(paths):
            yield i, plan_run(sweep_id, path)

    def submit_tasks(self, batches, settings, finished):
        for items, _ in batches:
            for key, result in evaluate_batch(items, **settings):
                self._done.append((key, result))
                finished()

    def results(self, finished):
        yield from self._done
        self._done.clear()
        forget_trials()

    def cancel(self, sweep_id) -> None:
        forget_trials()


class DaskExecutor:
    """Each run's rule tasks are submitted as soon as its plan is known, with the plan's priority: the
    workers go through the runs roughly in order, a run's tasks before the next plans, so that the
    trials a worker keeps are those its next tasks read."""

    def __init__(self, client):
        self.client = client
        self.futures = {}
        self.plans = {}

    def map_plans(self, sweep_id, paths, job):
        from distributed import as_completed

        futures = self.plans = {
            self.client.submit(plan_and_evaluate, sweep_id, i, paths, job, pure=False, priority=-i): i
            for i in range(len(paths))
        }
        for future in as_completed(futures):
            i = futures[future]
            try:
                plan = future.result()
            except Exception as exc:  # e.g. the worker died more often than Dask retries
                plan = {"error": describe_error(exc)}
            yield i, plan

    def submit_tasks(self, batches, settings, finished):
        for items, (run_index, worker) in batches:
            # preferably where the plan ran, which has the trial open (any worker when that one is busy)
            where = dict(workers=[worker], allow_other_workers=True) if worker else {}
            future = self.client.submit(
                evaluate_batch, items, **settings, pure=False, priority=-run_index, **where
            )
            self.futures[future] = [key for key, _ in items]

    def results(self, finished):
        from distributed import as_completed

        for future in as_completed(list(self.futures)):
            keys = self.futures.pop(future)
            try:
                done = future.result()
            except Exception as exc:  # e.g. lost with its worker more often than Dask retries
                done = [(key, error_result(describe_error(exc))) for key in keys]
            for key, result in done:
                finished()
                yield key, result

    def cancel(self, sweep_id) -> None:
        """Leave nothing of the sweep running on the cluster (it may be the user's): its queued tasks are
        cancelled, and those following live runs are told to end."""
        from distributed import Event

        Event(cancel_event_name(sweep_id), client=self.client).set()
        self.client.cancel([*self.plans, *self.futures])


def dask_available() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def local_client(workers: int):
    """A Client of a LocalCluster of ``workers`` single-threaded processes (closed with the client)."""
    from smdebug._optional import MissingDependencyError

    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError:
        raise MissingDependencyError(f"parallel workers need dask.distributed: {DASK_HINT}") from None
    # The workers' statistical profiler samples the running task's Python stack every 10 ms: rules are
    # Python-heavy and run several times slower under it.
    # Its scheduler serves HTTP (health checks) on 8787 even without a dashboard: when another cluster
    # holds that port it takes a free one, with a warning that is no concern of a sweep's user.
    with dask.config.set({"distributed.worker.profile.enabled": False}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
    client = Client(cluster)
    client.run(_warm_up)  # the workers' imports happen while the cluster starts, not in their first tasks
    return client, True


def _warm_up() -> None:
    """Import what a task needs (trials, the built-in rules, the plugins) in this process."""
    from smdebug.rules.builtin import builtin_rules
    from smdebug.trials import create_trial  # noqa: F401

    builtin_rules()  # loads the plugins, which may add rules


def connect(address: str, timeout: float = 20):
    """A Client of the Dask scheduler at address (``tcp://host:8786``)."""
    from smdebug._optional import MissingDependencyError

    try:
        from distributed import Client
    except ImportError:
        raise MissingDependencyError(f"--scheduler needs dask.distributed: {DASK_HINT}") from None
    try:
        return Client(address, timeout=timeout)
    except OSError as exc:
        raise SMDebugValueError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


def default_workers() -> int:
    return max(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 1)
