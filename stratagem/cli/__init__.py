"""The `stratagem` command line: one subcommand per module listed in COMMANDS, plus plug-ins.

Each module `stratagem.cli.<name>` has `register(subparsers)`, which adds its subparser and sets
`func=handler`, where `handler(args) -> int` is the exit status. Modules import their heavy
dependencies inside the handler, so `stratagem --help` stays fast.

Other installed packages add commands the same way through the `stratagem.commands` entry-point
group: the service contributes `serve` and `db` (`optimizer_service.cli`), so the library never
imports the service. Where the service is not installed, those two names still parse and say how to
install it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from stratagem.errors import StratagemError

COMMANDS = ["capture", "calibrate", "optimize", "predict", "jobs", "trials"]
PLUGIN_GROUP = "stratagem.commands"
SERVICE_COMMANDS = {"serve": "run the optimizer service", "db": "migrate the service's database"}
"""Commands the service plugs in, named here only to explain their absence."""
SERVICE_EXTRAS_HINT = "install the service extras: pip install 'stratagem[service]'"

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
    plugged = set()
    for entry in entry_points(group=PLUGIN_GROUP):
        entry.load().register(subparsers)
        plugged.add(entry.name)
    for name, help_text in SERVICE_COMMANDS.items():
        if name not in plugged:
            subparsers.add_parser(name, help=f"{help_text} (needs the service extras)")
    return parser


def _service_command_missing(argv: Sequence[str]) -> str | None:
    """The service command `argv` asks for when the service has not plugged it in (its own options are
    unknown here, so this is decided before parsing them)."""
    if not argv or argv[0] not in SERVICE_COMMANDS:
        return None
    return None if argv[0] in {entry.name for entry in entry_points(group=PLUGIN_GROUP)} else argv[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a StratagemError (or OSError) prints `error: <message>` and exits 2, without a traceback."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    missing = _service_command_missing(argv)
    if missing:
        print(
            f"error: `stratagem {missing}` comes with the service, which is not installed; {SERVICE_EXTRAS_HINT}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        return int(args.func(args))
    except StratagemError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:  # a file the handler did not check first: still one line, never a traceback
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
