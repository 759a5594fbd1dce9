"""Proves a new GPU host in one command: an alias of `timeshare gpu-check`."""

from __future__ import annotations

from timeshare.gpu_check import main as gpu_check


def main() -> None:
    gpu_check.main()
