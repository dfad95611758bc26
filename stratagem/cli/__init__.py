"""The `stratagem` command line: one subcommand per module listed in COMMANDS.

Each module `stratagem.cli.<name>` has `register(subparsers)`, which adds its subparser and sets
`func=handler`, where `handler(args) -> int` is the exit status. Modules import their heavy
dependencies inside the handler, so `stratagem --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from stratagem.errors import StratagemError

COMMANDS = ["capture", "calibrate", "optimize", "jobs", "trials", "serve", "db"]

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    from stratagem import __version__

    parser = argparse.ArgumentParser(
        prog="stratagem", description="Find the fastest way to train a model on a cluster, and run it."
    )
    parser.add_argument("--version", action="version", version=f"stratagem {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"stratagem.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a StratagemError prints `error: <message>` and exits 2, without a traceback."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        return int(args.func(args))
    except StratagemError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
