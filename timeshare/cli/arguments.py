"""What every subcommand's arguments share: checked number types, a parser
that reports a bad argument in one line and shows defaults and examples in
its help, and the defaults."""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, NoReturn

from timeshare.agent_socket import AGENT_SOCKET_ENV, SYSTEM_AGENT_SOCKET
from timeshare.cli.examples import epilog
from timeshare.cli.exit_codes import ExitCode
from timeshare.cli.help_format import HelpFormatter

DEFAULT_LISTEN = "127.0.0.1:50051"
GATEWAY_HELP = "gateway HOST:PORT (env TIMESHARE_ADDRESS; default localhost:50051)"


def default_node_name() -> str:
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", socket.gethostname().lower()).strip("-._")
    return os.environ.get("TIMESHARE_NODE") or (cleaned[:63].rstrip("-._") or "node-0")


def default_agent_socket() -> str:
    """The socket of a node's agent run as a service (`timeshare agent`)."""
    return os.environ.get(AGENT_SOCKET_ENV, SYSTEM_AGENT_SOCKET)


def plain_number(value: float) -> str:
    """A bound as a person writes it: 4194304, 0.000001, 604800 (never 4.1943e+06)."""
    if float(value).is_integer():
        return str(int(value))
    return format(Decimal(repr(float(value))).normalize(), "f")


def _number(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high], else one clear error."""
    whole = "a whole number" if kind is int else "a number"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {whole}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if not (low <= value <= high):
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: give {whole} from {plain_number(low)} "
                f"to {plain_number(high)}"
            )
        return value

    parse.__name__ = kind.__name__
    return parse


PORT = _number(int, 1, 65535)
COUNT = _number(int, 1, 10**9)
PID = _number(int, 2, 2**22)
SECONDS = _number(float, 0.0, 7 * 86400.0)
PERIOD = _number(float, 0.001, 7 * 86400.0)
AMOUNT = _number(float, 1e-6, 1e6)
RATE = _number(float, 0.0, 1e6)
SIZE = _number(float, 0.0, 1e6)
FRACTION = _number(float, 0.0, 1.0)
# As a Join takes them (timeshare.scheduling.events.Join).
WEIGHT = _number(float, 1e-6, 1000.0)
PRIORITY = _number(int, -1000, 1000)
GPU_COUNT = _number(int, 1, 256)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr, not the usage text;
    and each help shows the defaults and ends with the command's examples
    (timeshare.cli.examples). Subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        if self.epilog is None:
            self.epilog = epilog(self.prog.removeprefix("timeshare").strip())

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


class RenamedFlag(argparse.Action):
    """A flag with an old name kept working: the first option string is the
    name, the others old ones, each use of which says so on stderr."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None and option_string != self.option_strings[0]:
            print(
                f"{parser.prog}: {option_string} is deprecated; write {self.option_strings[0]}",
                file=sys.stderr,
            )
        setattr(namespace, self.dest, values)


def fail(message: str, code: int = ExitCode.FAILED) -> int:
    """Say what went wrong in one line; the exit code to return."""
    print(f"timeshare: {message}", file=sys.stderr)
    return code
