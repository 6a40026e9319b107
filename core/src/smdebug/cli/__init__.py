"""The ``smdebug`` command line.

Subcommands come from the ``smdebug_add_commands`` hook: the core adds its own (the modules in
``COMMAND_MODULES``, each with an ``add_command(subparsers)`` function) and any plugin can add more.
A subcommand's parser sets ``func``; ``func(args)`` returns the exit code.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import traceback

from smdebug import __version__
from smdebug.exceptions import SMDebugError

# The core's own subcommands, one module each.
COMMAND_MODULES: tuple[str, ...] = (
    "smdebug.cli.ls",
    "smdebug.cli.show",
    "smdebug.cli.plot",
    "smdebug.cli.tensorboard",
    "smdebug.cli.rules",
    "smdebug.cli.run",
    "smdebug.cli.plugins",
    "smdebug.cli.diff",
    "smdebug.cli.report",
    "smdebug.cli.why",
)

EXIT_ERROR = 2
INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose error about a mistyped flag or command also suggests the nearest one
    (a subcommand's parser is one too: argparse makes them of their parent's class)."""

    def error(self, message: str):
        super().error(message + did_you_mean(self, message))


def did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """'; did you mean X?' for the first unknown flag or invalid choice an argparse error names, or ''."""
    choice = INVALID_CHOICE.search(message)
    if choice:
        word, known = choice.group(1), [c.strip("'\" ") for c in choice.group(2).split(",")]
    elif message.startswith("unrecognized arguments: "):
        flags = [w for w in message.split()[2:] if w.startswith("-")]
        word = flags[0].split("=", 1)[0] if flags else ""
        known = [o for action in parser._actions for o in action.option_strings]
    else:
        return ""
    close = difflib.get_close_matches(word, known, n=1) if word else []
    return f"; did you mean {close[0]!r}?" if close else ""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="smdebug", description="Inspect and analyse smdebug runs.")
    parser.add_argument("--version", action="version", version=f"smdebug {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # imported here: the submodule smdebug.cli.plugins, once imported, is this package's `plugins`
    from smdebug import plugins

    plugins.add_commands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported with the usage of the subcommand they were given to, not the top-level one
        (_subcommand_parser(parser, args) or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`smdebug ls RUN | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's flush must not fail)
        return 141  # as a process killed by SIGPIPE
    except re.error as exc:  # a regex given on the command line (--regex, a TENSOR pattern)
        print(f"smdebug {args.command}: error: invalid regex: {exc.msg}", file=sys.stderr)
        return EXIT_ERROR
    except (SMDebugError, OSError, ValueError, KeyError) as exc:
        # One clear line, not a traceback: these are problems with the input, not bugs.
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"smdebug {args.command}: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # a bug: its traceback, and not exit code 1, an answer (diff: they differ)
        traceback.print_exc()
        print(f"smdebug {args.command}: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _subcommand_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(getattr(args, "command", None))
    return None
