"""``smdebug plugins``: the installed plugins, their distributions, the hooks they implement, and why
any failed to load."""

from __future__ import annotations

import json


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "plugins",
        help="list the installed plugins, the hooks each implements and any load error",
        description="List every smdebug plugin (the core's defaults, the installed entry points, any "
        "registered by code): its distribution and version, the hooks it implements, and why it failed "
        "to load or that SMDEBUG_DISABLE_PLUGINS disabled it.",
    )
    parser.add_argument("--json", action="store_true", help="print the listing as JSON")
    parser.set_defaults(func=run)


def run(args) -> int:
    from smdebug import plugins

    found = plugins.describe()
    if args.json:
        print(json.dumps([info.as_dict() for info in found], indent=2))
        return 0
    for info in found:
        source = (
            f"{info.distribution} {info.version or ''}".strip() if info.distribution else "registered by code"
        )
        print(f"{info.name}  ({source})")
        if info.entry_point:
            print(f"  entry point: {info.entry_point}")
        if info.disabled:
            print("  disabled by SMDEBUG_DISABLE_PLUGINS")
        elif info.error:
            print(f"  LOAD ERROR: {info.error}")
        else:
            print(f"  hooks: {', '.join(info.hooks) or '-'}")
    return 0
