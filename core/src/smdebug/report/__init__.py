"""A run as one self-contained HTML page: curves with rule firings, per-layer gradient and weight-update
heatmaps, the built-in rules' results, what the run holds and lost (``smdebug report RUN``).

No plotting library: the page draws its charts with a few kB of inline script (see ``page``).
"""

from __future__ import annotations

import os

from smdebug.report.data import Limits, collect
from smdebug.report.page import render

__all__ = ["Limits", "build_report", "check_output", "render", "snapshot", "write_page", "write_report"]


def build_report(
    trial,
    *,
    reduction: str | None = None,
    rules: bool = True,
    limits: Limits | None = None,
    reload_seconds: float = 0.0,
) -> str:
    """The HTML page of ``trial`` (a Trial or a run's path)."""
    return render(snapshot(trial, reduction=reduction, rules=rules, limits=limits), reload_seconds)


def snapshot(trial, **options) -> dict:
    """What the page of ``trial`` (a Trial or a run's path) shows, read once (``collect``'s data, which
    ``render`` makes a page of): a live run's page can be rendered again from it without reading the run."""
    if isinstance(trial, (str, os.PathLike)):
        from smdebug.trials import create_trial

        trial = create_trial(os.fspath(trial))
    from smdebug.analysis.utils import no_refresh

    trial.maybe_refresh(force=True)
    with no_refresh([trial]):  # one consistent snapshot of a live run, not a listing per query
        return collect(trial, **options)


def check_output(output) -> str:
    """``output`` as an absolute path, once its folder is known to exist (else a one-line error); a URI
    (``s3://bucket/report.html``, any fsspec one) as it is."""
    from smdebug.exceptions import SMDebugValueError
    from smdebug.store import Store

    output = os.fspath(output)
    if not Store.is_plain_local(output):
        Store(output.rpartition("/")[0])  # its filesystem's package is there (s3fs), before any work
        return output
    output = os.path.abspath(output.removeprefix("file://"))
    if os.path.isdir(output):
        raise SMDebugValueError(
            f"{output} is a folder: give the report's file name (-o {output}/report.html)"
        )
    if not os.path.isdir(os.path.dirname(output)):
        raise SMDebugValueError(f"{output}: cannot write the report: its folder does not exist")
    return output


def write_report(trial, output: str, **kwargs) -> str:
    """Write the page to the local file or fsspec URI ``output``, replaced whole, so that a browser never
    reads half a page."""
    output = check_output(output)
    return write_page(build_report(trial, **kwargs), output)


def write_page(page: str, output: str) -> str:
    """Write an HTML page to the local file or fsspec URI ``output`` (checked), replaced whole (a symlink's
    target; a device or FIFO is written into)."""
    from smdebug.store import Store

    if not Store.is_plain_local(output):  # a URI: written whole through fsspec, as the runs are read
        folder, _, name = output.rpartition("/")
        Store(folder).write_bytes(name, page.encode("utf-8"))
        return output
    # a device or FIFO (-o /dev/null, -o /dev/stdout), or a link to one: written into as it is, since
    # replacing it would put a regular file in its place (as root, over /dev/null)
    if os.path.exists(output) and not os.path.isfile(output):
        with open(output, "w", encoding="utf-8") as f:
            f.write(page)
        return output
    target = os.path.realpath(output)  # a symlink: its target is replaced whole, the link stays
    tmp = f"{target}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return output
