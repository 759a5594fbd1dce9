"""Freezing a job's own cgroup: cgroup v2 `cgroup.freeze`, or the v1 freezer.

Used when every registered process of a job (and nothing else) sits in one
cgroup that is not the root: freezing it is atomic and catches processes the
job starts later, which SIGSTOP of a process tree cannot."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 2: unified; 1: the v1 freezer controller
    mount: Path


@dataclass(frozen=True)
class FreezerCgroup:
    hierarchy: Hierarchy
    path: Path

    @property
    def state_file(self) -> Path:
        return self.path / ("cgroup.freeze" if self.hierarchy.version == 2 else "freezer.state")

    def frozen(self) -> bool:
        if self.hierarchy.version == 2:
            events = (self.path / "cgroup.events").read_text().split()
            return events[events.index("frozen") + 1] == "1"
        return (self.path / "freezer.state").read_text().strip() == "FROZEN"

    def request(self, frozen: bool) -> None:
        if self.hierarchy.version == 2:
            self.state_file.write_text("1" if frozen else "0")
        else:
            self.state_file.write_text("FROZEN" if frozen else "THAWED")

    async def set_frozen(self, frozen: bool, timeout: float) -> bool:
        """Freeze or thaw; True once the kernel reports it done within ``timeout``."""
        self.request(frozen)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.frozen() != frozen:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True


def hierarchies() -> list[Hierarchy]:
    """Writable cgroup v2 and v1-freezer mounts, v2 first."""
    found = []
    for line in (PROC / "self" / "mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        mount, fstype, options = Path(fields[4]), fields[separator + 1], fields[-1]
        if fstype == "cgroup2":
            found.append(Hierarchy(2, mount))
        elif fstype == "cgroup" and "freezer" in options.split(","):
            found.append(Hierarchy(1, mount))
    return sorted(found, key=lambda h: -h.version)


def cgroup_of(pid: int, hierarchy: Hierarchy) -> str | None:
    try:
        lines = (PROC / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (hierarchy.version == 2 and controllers == "") or (
            hierarchy.version == 1 and "freezer" in controllers.split(",")
        ):
            return path
    return None


def own_cgroup(pids: list[int]) -> FreezerCgroup | None:
    """The cgroup holding exactly these processes, if there is one."""
    if not pids:
        return None
    for hierarchy in hierarchies():
        paths = {cgroup_of(pid, hierarchy) for pid in pids}
        if len(paths) != 1 or None in paths or "/" in paths:
            continue
        path = hierarchy.mount / str(paths.pop()).lstrip("/")
        try:
            members = {int(p) for p in (path / "cgroup.procs").read_text().split()}
        except OSError:
            continue
        if members <= set(pids) and os.getpid() not in members and os.access(path, os.W_OK):
            return FreezerCgroup(hierarchy, path)
    return None
