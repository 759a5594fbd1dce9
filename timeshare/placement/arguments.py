"""The arguments of `timeshare plan` and `timeshare profile`, apart from
their work so that building the CLI's parser imports nothing else."""

from __future__ import annotations

import argparse
from pathlib import Path

# Seconds the heuristic search (over 10 jobs) may take by default.
TIME_LIMIT_SECONDS = 20.0


def _state(text: str) -> tuple[str, float]:
    job, _, gib = text.partition("=")
    try:
        return job, float(gib)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give JOB=GIB") from None


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", nargs="?", type=Path, help="jobs and GPU sets: YAML (extra `plan`) or JSON"
    )
    parser.add_argument("--out", type=Path, help="write the plan here (JSON)")
    parser.add_argument("--group-prefix", default="share", help="planned groups are PREFIX-1 ...")
    parser.add_argument(
        "--time-limit", type=float, default=TIME_LIMIT_SECONDS,
        help="seconds the heuristic search (over 10 jobs) may take",
    )  # fmt: skip
    live = parser.add_argument_group("--from-groups: advice on the live groups (moves nothing)")
    live.add_argument("--from-groups", action="store_true", help="profile every live group")
    live.add_argument("--groups", help="only these groups, comma-separated")
    live.add_argument(
        "--max-slowdown", type=float, default=1.5, help="no job slower than this, than alone"
    )
    live.add_argument("--gpu-memory-gib", type=float, default=80.0, help="per GPU set")
    live.add_argument("--host-memory-gib", type=float, default=512.0, help="per GPU set")
    live.add_argument("--bandwidth-gbps", type=float, help="default: as the switches measured")
    live.add_argument(
        "--co-residency-margin-gib", type=float, default=2.0,
        help="as the agents' --co-residency-margin-gib",
    )  # fmt: skip
    live.add_argument(
        "--state-gib", type=_state, action="append", default=[], metavar="JOB=GIB",
        help="state of a job its history never saw checkpointed",
    )  # fmt: skip
    live.add_argument("--address", help="gateway HOST:PORT (env TIMESHARE_ADDRESS)")


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """All but the group, which the CLI names as every command does (--group)."""
    parser.add_argument(
        "--json", action="store_true", help="the profiles as JSON (accepted in a plan's jobs:)"
    )
    parser.add_argument("--address", help="gateway HOST:PORT (env TIMESHARE_ADDRESS)")
