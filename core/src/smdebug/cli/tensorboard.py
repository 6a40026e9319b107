"""``smdebug export-tensorboard OUT LOGDIR``: a saved run as TensorBoard event files."""

from __future__ import annotations

from smdebug._optional import install_hint
from smdebug.cli._common import open_trial, require_worker


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-tensorboard",
        help="write TensorBoard summaries of a run (scalars, reductions, histograms)",
        description="Write TensorBoard event files for a saved run under LOGDIR, one folder per mode "
        "(LOGDIR/TRAIN, LOGDIR/EVAL, ...): scalars for one-element values of scalar collections and for "
        "saved reductions, histograms for tensors of collections with save_histogram. Then: "
        "tensorboard --logdir LOGDIR",
    )
    parser.add_argument("out_dir", metavar="OUT", help="the run's output location (path or URI)")
    parser.add_argument("logdir", metavar="LOGDIR", help="where to write the event files (path or URI)")
    parser.add_argument("--worker", help="whose values to export (default: the first worker)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from smdebug.tensorboard import export_tensorboard

    trial = open_trial(args.out_dir)
    args.worker = require_worker(trial, args.worker)
    counts = export_tensorboard(trial, args.logdir, worker=args.worker)
    modes = ", ".join(m.name for m in trial.modes(include_global=True))
    try:  # writing needs no TensorBoard, viewing does
        import tensorboard  # noqa: F401

        view = f"view them with: tensorboard --logdir {args.logdir}"
    except ImportError:
        view = f"to view them, install TensorBoard ({install_hint('tensorboard')}), then: tensorboard --logdir {args.logdir}"
    damaged = f", skipped {counts['damaged']} damaged value(s) (named above)" if counts["damaged"] else ""
    print(
        f"wrote {counts['scalars']} scalars and {counts['histograms']} histograms to {args.logdir} "
        f"(modes: {modes or '-'}{damaged}); {view}"
    )
    return 0
