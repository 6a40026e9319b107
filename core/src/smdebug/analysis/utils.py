"""``no_refresh`` / ``refresh``: turn a live trial's re-reading off or on for a block of code.

Each query of a trial over a run still being written re-reads what has been written since (a listing
of the run's newest index folder); inside ``no_refresh(trials)`` the trials answer from what they have
loaded, so several queries see one consistent state::

    with no_refresh([trial]):
        steps = trial.steps()
        names = trial.tensor_names(step=steps[-1])
"""

from __future__ import annotations

from contextlib import contextmanager


def _as_list(trials) -> list:
    return list(trials) if isinstance(trials, (list, tuple, set)) else [trials]


@contextmanager
def _dynamic_refresh(trials, value: bool):
    trials_list = _as_list(trials)
    before = [t.dynamic_refresh for t in trials_list]
    for t in trials_list:
        t.dynamic_refresh = value
    try:
        yield trials
    finally:  # back to what each trial had, so that the two nest
        for t, was in zip(trials_list, before):
            t.dynamic_refresh = was


def no_refresh(trials):
    """Within the block, the trial (or each trial of a list) does not re-read its run."""
    return _dynamic_refresh(trials, False)


def refresh(trials):
    """Within the block, the trial (or each trial of a list) re-reads its run when queried."""
    return _dynamic_refresh(trials, True)
