"""python -m timeshare.gpu_check.emulator build DIR: compile the GPU emulator into DIR."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from timeshare.gpu_check.emulator import LIBCUDA, LIBNVML, UTILITY, EmulatorError, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m timeshare.gpu_check.emulator")
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser("build", help="compile the emulator into DIR")
    build_command.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    try:
        directory = build(args.dir).resolve()
    except EmulatorError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"GPU emulator built in {directory}: {LIBCUDA}, {LIBNVML}, {UTILITY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
