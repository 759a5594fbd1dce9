"""What every subcommand's arguments share: checked number types, a parser
that reports a bad argument in one line, and the defaults."""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from collections.abc import Callable
from typing import NoReturn

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_AGENT_SOCKET = "/run/timeshare/agent.sock"
GATEWAY_HELP = "gateway HOST:PORT (env TIMESHARE_ADDRESS)"


def default_node_name() -> str:
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", socket.gethostname().lower()).strip("-._")
    return os.environ.get("TIMESHARE_NODE") or (cleaned[:63].rstrip("-._") or "node-0")


def default_agent_socket() -> str:
    return os.environ.get("TIMESHARE_AGENT_SOCKET", DEFAULT_AGENT_SOCKET)


def _number(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high], else one clear error."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (low <= value <= high):  # also refuses NaN
            raise argparse.ArgumentTypeError(f"{text} is outside {low:g}..{high:g}")
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
# As a Join takes them (timeshare.models.JoinInput).
WEIGHT = _number(float, 1e-6, 1000.0)
PRIORITY = _number(int, -1000, 1000)
GPU_COUNT = _number(int, 1, 256)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr, not the usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def fail(message: str, code: int = 1) -> int:
    """Say what went wrong in one line; the exit code to return."""
    print(f"timeshare: {message}", file=sys.stderr)
    return code
