"""`timeshare bundle`: an offline install for hosts without a network. A client
command: it needs pip, not the server parts it bundles."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from timeshare.cli.arguments import fail

Subparsers = Any  # argparse's _SubParsersAction, private in typeshed


def _checked(parse: Callable[[str], str]) -> Callable[[str], str]:
    def check(text: str) -> str:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    check.__name__ = parse.__name__
    return check


def add_bundle_command(commands: Subparsers) -> None:
    from timeshare.bundle.platforms import parse_platform, parse_python_version

    bundle = commands.add_parser(
        "bundle",
        help="write timeshare[server,cuda], its dependencies and the Temporal CLI to a folder "
        "that installs with no network (install.sh)",
    )
    bundle.add_argument("--out", type=Path, required=True, help="a new or empty folder")
    bundle.add_argument(
        "--python-version", type=_checked(parse_python_version), metavar="X.Y",
        help="the host's Python (default: this one's)",
    )  # fmt: skip
    bundle.add_argument(
        "--platform", type=_checked(parse_platform), action="append", default=[],
        metavar="TAG",
        help="the host's wheel platform, manylinux_2_28_x86_64 for glibc 2.28 and later, say: "
        "older manylinux tags are taken too (repeatable; default: this machine's)",
    )  # fmt: skip
    bundle.add_argument(
        "--compression", choices=["lzma", "as-published"], default="lzma",
        help="lzma (default): every wheel packed again with LZMA, about a quarter smaller, "
        "minutes of CPU; as-published: the wheels as the package index serves them",
    )  # fmt: skip
    bundle.set_defaults(handler=run_bundle)


def run_bundle(args: argparse.Namespace) -> int:
    from timeshare.bundle.errors import BundleError
    from timeshare.bundle.make import BundleOptions, make_bundle

    options = BundleOptions(
        out=args.out,
        python_version=args.python_version,
        platforms=args.platform,
        compression=args.compression,
    )
    try:
        make_bundle(options, lambda line: print(f"timeshare bundle: {line}", flush=True))
    except BundleError as error:
        return fail(f"bundle: {error}")
    return 0
