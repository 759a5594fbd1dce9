"""The options of `timeshare gpu-check`: light to import, since every
`timeshare` command builds its parser (the check's own modules load the
server parts)."""

from __future__ import annotations

import argparse
from pathlib import Path

BUDGET_SECONDS = 480.0
# The extra that brings the check's Python parts.
EXTRA = "timeshare[gpu-check]"
# The switch scenarios, in the order they run (timeshare.gpu_check.switch.SCENARIOS).
SWITCH_SCENARIOS = ("cuda", "freeze+cuda", "cuda-checkpoint", "co-residency", "hooks")
STEPS = ("probe", "conformance", "blog", *SWITCH_SCENARIOS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gib", type=float, default=None,
        help="device memory per job, GiB (default 2 on a GPU, 0.05 emulated)",
    )  # fmt: skip
    parser.add_argument("--handovers", type=int, default=6, help="switches per switch scenario")
    parser.add_argument("--iterations", type=int, default=6,
                        help="RL iterations of each job in the blog's scenario")  # fmt: skip
    parser.add_argument("--out", type=Path, help="where the reports go (default: a new folder)")
    parser.add_argument("--emulator", action="store_true", help="no GPU: the GPU emulator")
    parser.add_argument("--skip", default="", help=f"comma-separated steps, of {', '.join(STEPS)}")
    parser.add_argument(
        "--budget-seconds", type=float, default=BUDGET_SECONDS,
        help="the whole check's limit; a step that cannot start in it fails",
    )  # fmt: skip
    parser.add_argument("--scenario-seconds", type=float, default=90.0,
                        help="each switch scenario's limit")  # fmt: skip


def checked(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    skipped = {name for name in args.skip.split(",") if name}
    if skipped - set(STEPS):
        parser.error(f"no step {', '.join(sorted(skipped - set(STEPS)))}; there are "
                     f"{', '.join(STEPS)}")  # fmt: skip
    args.skipped = skipped
    if args.gib is None:
        args.gib = 0.05 if args.emulator else 2.0
    if args.gib <= 0:
        parser.error("--gib must be above 0")
    return args
