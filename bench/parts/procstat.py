"""CPU time of processes, read from /proc: what a benchmark charges to each
part of the stack over a window."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from timeshare.activities.backends.processes import descendants


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """The CPU of ``pid`` and of every process below it that still runs (the
    Temporal dev server runs below `timeshare temporal`)."""
    total = 0.0
    for member in descendants(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds(member)
    return total


class CpuMeter:
    """CPU seconds of named processes from the moment it is made (or reset):
    each with the processes below it, but this process alone (the stack it
    started runs below it)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self._start = self._read()

    def _read(self) -> dict[str, float]:
        return {
            name: cpu_seconds(pid) if pid == os.getpid() else tree_cpu_seconds(pid)
            for name, pid in self.pids.items()
        }

    def reset(self) -> None:
        self._start = self._read()

    def used(self) -> dict[str, float]:
        now = self._read()
        return {name: now[name] - self._start[name] for name in self.pids}


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as `uptime` prints them, and where
    the kernel tells it, the share of the last minute in which some runnable
    task waited for a CPU (other work on a shared machine shows here)."""
    loads = ", ".join(Path("/proc/loadavg").read_text().split()[:3])
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return loads
    avg60 = dict(field.split("=", 1) for field in some[1:] if "=" in field).get("avg60", "?")
    return f"{loads}; CPU pressure {avg60} %"
