"""A job's cgroups: freezing its own cgroup (cgroup v2 `cgroup.freeze`, or
the v1 freezer), and the memory limit its processes live under.

Freezing is used when every registered process of a job (and nothing else)
sits in one cgroup that is not the root: freezing it is atomic and catches
processes the job starts later, which SIGSTOP of a process tree cannot."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 2: unified; 1: a v1 controller's own hierarchy
    mount: Path
    controller: str = "freezer"  # the v1 controller (v2 has every one)


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


def hierarchies(controller: str = "freezer") -> list[Hierarchy]:
    """Cgroup v2 mounts and the v1 mounts of ``controller``, v2 first."""
    found = []
    for line in (PROC / "self" / "mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        mount, fstype, options = Path(fields[4]), fields[separator + 1], fields[-1]
        if fstype == "cgroup2":
            found.append(Hierarchy(2, mount, controller))
        elif fstype == "cgroup" and controller in options.split(","):
            found.append(Hierarchy(1, mount, controller))
    return sorted(found, key=lambda h: -h.version)


def cgroup_of(pid: int, hierarchy: Hierarchy) -> str | None:
    try:
        lines = (PROC / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (hierarchy.version == 2 and controllers == "") or (
            hierarchy.version == 1 and hierarchy.controller in controllers.split(",")
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


# Limits of v1 (memory.limit_in_bytes) at or above this are "no limit": the
# kernel shows an unlimited cgroup as PAGE_COUNTER_MAX pages (9223372036854771712
# with 4 KiB pages).
V1_NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class MemoryRoom:
    """How much more a cgroup (the tightest of a process's and its
    ancestors') can be charged before it reaches its memory limit."""

    bytes: int
    cgroup: str
    file: str
    limit: int
    used: int


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit (v2)


def cgroup_memory_room(hierarchy: Hierarchy, path: str) -> MemoryRoom | None:
    """The tightest memory limit from the cgroup at ``path`` up to the
    hierarchy's root: v2 memory.max less memory.current, v1
    memory.limit_in_bytes less memory.usage_in_bytes; None where none is set."""
    names = (
        ("memory.max", "memory.current")
        if hierarchy.version == 2
        else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    )
    tightest: MemoryRoom | None = None
    directory = hierarchy.mount / path.lstrip("/")
    while True:
        limit, used = _read_int(directory / names[0]), _read_int(directory / names[1])
        if limit is not None and used is not None and limit < V1_NO_LIMIT:
            relative = directory.relative_to(hierarchy.mount)
            name = "/" if relative == Path(".") else f"/{relative}"
            room = MemoryRoom(max(0, limit - used), name, names[0], limit, used)
            if tightest is None or room.bytes < tightest.bytes:
                tightest = room
        if directory == hierarchy.mount or hierarchy.mount not in directory.parents:
            return tightest
        directory = directory.parent


def memory_room(pids: list[int]) -> MemoryRoom | None:
    """The tightest memory limit any of these processes lives under (the
    memory controller of cgroup v2 where it is enabled, else v1's)."""
    tightest: MemoryRoom | None = None
    for pid in pids:
        for hierarchy in hierarchies("memory"):
            path = cgroup_of(pid, hierarchy)
            if path is None:
                continue
            room = cgroup_memory_room(hierarchy, path)
            if room is not None and (tightest is None or room.bytes < tightest.bytes):
                tightest = room
    return tightest
