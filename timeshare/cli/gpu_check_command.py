"""`timeshare gpu-check`: check a new GPU host in one command
(timeshare.gpu_check). Needs `timeshare[gpu-check]`; it says so in one line
where a part is missing, before it starts anything."""

from __future__ import annotations

import argparse
from typing import Any

Subparsers = Any  # argparse's _SubParsersAction, private in typeshed


def add_gpu_check_command(commands: Subparsers) -> None:
    from timeshare.gpu_check.arguments import EXTRA, add_arguments

    gpu_check = commands.add_parser(
        "gpu-check",
        help="check this GPU host: driver probe, backends' conformance, two RL jobs sharing "
        f"the GPU, switch scenarios (needs {EXTRA})",
        description="Check this GPU host in one command, within 8 minutes on one GPU. The "
        f"Python parts come with {EXTRA} (every `timeshare bundle` holds them); the driver, "
        "PyTorch with CUDA and NVIDIA's cuda-checkpoint utility are the host's.",
    )
    add_arguments(gpu_check)
    gpu_check.set_defaults(handler=run_gpu_check, parser=gpu_check)


def run_gpu_check(args: argparse.Namespace) -> int:
    from timeshare.gpu_check.arguments import checked
    from timeshare.gpu_check.main import run

    return run(checked(args, args.parser))
