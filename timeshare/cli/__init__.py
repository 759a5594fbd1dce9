"""The `timeshare` command: one parser, its subcommands in three modules (the
client commands a light install runs, the server commands that need
`timeshare[server]`, `bundle`, which needs only pip, and `gpu-check`, which
needs `timeshare[gpu-check]`), and the
flag-to-settings mapping of the server processes in server_settings."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import NoReturn

import timeshare
from timeshare.cli.arguments import OneLineParser
from timeshare.cli.bundle_command import add_bundle_command
from timeshare.cli.client_commands import add_client_commands
from timeshare.cli.exit_codes import ExitCode, exit_codes_epilog
from timeshare.cli.gpu_check_command import add_gpu_check_command
from timeshare.cli.server_commands import add_server_commands
from timeshare.cli.server_settings import gateway_security, temporal_settings
from timeshare.cli.subjects import resolve_subjects

__all__ = [
    "build_parser",
    "gateway_security",
    "main",
    "resolve_subjects",
    "subcommand_parsers",
    "temporal_settings",
]

# The light client (`pip install timeshare`) lacks these; a server command run there
# names the extra instead of failing with a traceback from deep inside a worker.
SERVER_MODULES = ("temporalio", "grpc_health", "opentelemetry.sdk")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="timeshare",
        description="Cooperative GPU time-slicing for RL jobs, on Temporal.\n"
        "Try it: `timeshare demo` (a simulated GPU; docs/getting-started.md).",
        epilog="`timeshare COMMAND --help` shows a command's options, defaults and an "
        "example.\n\n" + exit_codes_epilog(),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {timeshare.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_server_commands(commands)
    add_client_commands(commands)
    add_bundle_command(commands)
    add_gpu_check_command(commands)
    for command in commands.choices.values():
        # Each command's own parser, for errors found after parsing (its prog names it).
        command.set_defaults(parser=command)
    return parser


def subcommand_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: list[str] | None = None) -> NoReturn:
    if os.environ.get("TIMESHARE_DIE_WITH_PARENT"):
        from timeshare.workers.common.children import die_with_parent_if_asked

        die_with_parent_if_asked()
    args = build_parser().parse_args(argv)
    resolve_subjects(args, args.parser)
    missing = missing_server_parts() if getattr(args, "server", False) else None
    if missing:
        print(
            f"timeshare: `timeshare {args.command}` needs the server parts ({missing} is not"
            " installed): pip install 'timeshare[server]'",
            file=sys.stderr,
        )
        sys.exit(ExitCode.USAGE)
    sys.exit(args.handler(args))


def missing_server_parts() -> str | None:
    for module in SERVER_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a missing parent package
            found = False
        if not found:
            return module
    return None
