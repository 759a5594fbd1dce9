"""The node agent's `--backend`: its choices, checked while the command line
is read (so `timeshare up --backend gpu` is refused before Temporal starts),
and a loud warning when a host with NVIDIA GPUs falls back to the simulator.

Names only: the backends themselves (entry points `timeshare.backends`) load
in the agent, with the server parts."""

from __future__ import annotations

import argparse
import glob
import sys
from importlib.metadata import entry_points

from timeshare.names import BACKEND_ENTRY_POINT_GROUP

SIMULATED = "sim"
# The backend whose hooks must run first in a stack (see StackedBackend).
HOOKS_BACKEND = "app"
# What a GPU host should name: the driver's checkpoint API, hooks first where the job serves them.
GPU_BACKENDS = ("cuda", "app+cuda", "cuda-checkpoint", "freeze+cuda")
BACKEND_HELP = (
    "how the agent moves a job's GPU state: one of {names}, or several stacked with '+', "
    "acting in turn (app+cuda: the job's own hooks, then the driver's checkpoint of what "
    "they left; freeze+cuda: checkpoint, then freeze every process of the job). "
    "sim is a SIMULATED GPU, for laptops and tests (default: sim, with a warning on a host "
    "that has NVIDIA GPUs)"
)


def known_backends() -> list[str]:
    return sorted({point.name for point in entry_points(group=BACKEND_ENTRY_POINT_GROUP)})


def backend_help() -> str:
    return BACKEND_HELP.format(names=", ".join(known_backends()) or "none installed")


def backend_name(text: str) -> str:
    """An argparse type: a backend, or backends stacked with '+', all installed."""
    parts = text.split("+")
    known = known_backends()
    unknown = [part for part in parts if part not in known]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"there is no backend {unknown[0]!r}; choose from {', '.join(known)}, "
            "or stack them with '+' (app+cuda)"
        )
    if len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(f"{text!r} names a backend twice")
    if HOOKS_BACKEND in parts and parts[0] != HOOKS_BACKEND:
        raise argparse.ArgumentTypeError(
            f"{text!r}: app must come first in a stack (app+cuda), since the job's hooks run "
            "before the other layers stop its processes"
        )
    return text


def nvidia_devices() -> list[str]:
    """The NVIDIA GPU device files of this host (/dev/nvidia0, ...)."""
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


def chosen_backend(given: str | None, command: str) -> str:
    """The backend to run: the one given, else the simulator, said loudly on
    a host where a GPU would be there for the taking."""
    if given is not None:
        return given
    devices = nvidia_devices()
    if devices:
        print(
            f"timeshare {command}: WARNING: this host has NVIDIA GPUs ({', '.join(devices)}) "
            f"but no --backend was given, so the agent runs the SIMULATED backend {SIMULATED!r}: "
            "it moves no GPU memory and jobs on the real GPUs are not switched. Pass "
            f"--backend {GPU_BACKENDS[0]} (or {', '.join(GPU_BACKENDS[1:])}) for real switches.",
            file=sys.stderr,
            flush=True,
        )
    return SIMULATED
