"""``smdebug plot OUT TENSOR... -o out.png``: tensors over steps (values or reductions), with matplotlib."""

from __future__ import annotations

from smdebug.cli._common import add_mode_argument, open_trial, parse_mode, require_worker


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="plot tensors (values or reductions) over steps to an image file",
        description="Plot saved tensors over the global step: a one-element tensor as its value, a "
        "larger one as its l2 norm (or --reduction), one saved as reductions only as a saved "
        "reduction. Each TENSOR is a name or a regex. Needs matplotlib (pip install matplotlib).",
    )
    parser.add_argument("out_dir", metavar="OUT", help="the run's output location (path or URI)")
    parser.add_argument("tensors", metavar="TENSOR", nargs="+", help="tensor names or regexes")
    parser.add_argument("-o", "--output", required=True, help="image file to write (.png, .svg, .pdf)")
    parser.add_argument(
        "--reduction", help="draw this reduction of every tensor: min, max, mean, std, l1, l2, abs_mean, ..."
    )
    add_mode_argument(parser)
    parser.add_argument("--worker", help="whose values to draw (default: the first worker)")
    parser.add_argument("--log", action="store_true", help="logarithmic y axis")
    parser.add_argument("--separate", action="store_true", help="one panel per TENSOR argument")
    parser.add_argument("--title", help="title of the figure")
    parser.set_defaults(func=run)


def run(args) -> int:
    from smdebug.plots import plot

    trial = open_trial(args.out_dir)
    args.worker = require_worker(trial, args.worker)
    mode = parse_mode(args.mode)
    panels = plot(
        trial,
        args.tensors,
        args.output,
        reduction=args.reduction,
        mode=mode,
        worker=args.worker,
        log=args.log,
        separate=args.separate,
        title=args.title,
    )
    print(f"wrote {args.output}:")
    for i, drawn in enumerate(panels):
        prefix = f"  panel {i + 1}: " if len(panels) > 1 else "  "
        for series in drawn:
            print(f"{prefix}{series.label}: {len(series.steps)} points")
    return 0
