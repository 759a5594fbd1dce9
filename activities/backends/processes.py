"""Which processes belong to which job on this node.

Processes register through the agent's Unix socket, which takes their id
from the kernel (SO_PEERCRED), never from the message. A job's processes at
switch time are its registered processes that are still alive and their
descendants (data-loader children, tensor-parallel ranks it spawned).

The table survives an agent restart: it is kept in a file beside the agent's
socket, and on load keeps only processes that are the very ones registered
(same id and same start time, so a reused process id is not taken for one).

Whether a job that left its group was released here (its processes never
stopped again until it is a member again) is the node's core's to say
(timeshare/node/core.py): the table asks it (``decided_by``)."""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")
JobKey = tuple[str, str]  # (group, job)
log = logging.getLogger("timeshare.agent")


class RegistrationRefused(Exception):
    """The agent's socket refuses a request; ``code`` is the status the client raises."""

    code = "FAILED_PRECONDITION"


class NotPermitted(RegistrationRefused):
    """The caller may not do this to that job or process (its credential or
    its user id does not allow it)."""

    code = "PERMISSION_DENIED"


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first); [] if gone."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


# include/linux/sched.h: set as the process begins to exit, before its memory and
# files are let go; /proc shows it running (R, D) until it is a zombie, so a peer can
# see its sockets closed while its state still reads as alive.
PF_EXITING = 0x4
STAT_FLAGS = 6  # proc(5) field (9), counted from the state, field (3)


def _living(fields: list[str]) -> bool:
    """Runs (or is stopped) and is not on its way out: a killed process whose
    exit has begun is not alive, though its state has not yet turned Z."""
    if not fields or fields[0] in ("Z", "X"):
        return False
    return len(fields) <= STAT_FLAGS or not int(fields[STAT_FLAGS]) & PF_EXITING


def alive(pid: int) -> bool:
    return _living(_stat(pid))


def stopped(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] in ("T", "t")


def start_time(pid: int) -> str:
    """When the living process started, in clock ticks since boot ("" if gone):
    with its id, it names one process, since ids are reused."""
    fields = _stat(pid)
    return fields[19] if _living(fields) and len(fields) > 19 else ""


def parent(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def children(pid: int) -> list[int]:
    found = []
    for task in (PROC / str(pid) / "task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    result, pending = [], [pid]
    while pending:
        current = pending.pop()
        result.append(current)
        pending += [c for c in children(current) if c not in result]
    return result


def owner(pid: int) -> int:
    return (PROC / str(pid)).stat().st_uid


def check_may_manage(pid: int) -> None:
    """Refuse processes an agent must never stop: init, kernel threads, itself."""
    if pid <= 1:
        raise RegistrationRefused(f"process {pid} is init; refused")
    if not alive(pid):
        raise RegistrationRefused(f"process {pid} does not exist")
    if parent(pid) == 2 or not (PROC / str(pid) / "exe").exists():
        raise RegistrationRefused(f"process {pid} is a kernel thread; refused")
    ancestor = os.getpid()
    line = pid
    while line > 1:
        if line == ancestor:
            raise RegistrationRefused(f"process {pid} is the agent itself or its child; refused")
        line = parent(line)
    if pid in ancestors_of_agent():
        raise RegistrationRefused(f"process {pid} is an ancestor of the agent; refused")


def ancestors_of_agent() -> set[int]:
    found, pid = set(), os.getpid()
    while pid > 1:
        pid = parent(pid)
        found.add(pid)
    return found


class ProcessTable:
    def __init__(self, state_path: Path | None = None) -> None:
        self._pids: defaultdict[JobKey, set[int]] = defaultdict(set)
        # Jobs that registered processes here and have none left.
        self._gone: set[JobKey] = set()
        # Of those, the ones not yet taken by take_exited().
        self._exited: set[JobKey] = set()
        # Called with (group, job, new) after each registration; ``new``: a
        # process the table did not hold.
        self.on_register: list[Callable[[str, str, bool], None]] = []
        self._state_path = state_path
        self._started: dict[int, str] = {}
        self._released_by: Callable[[str, str], bool] = _never
        # Jobs a registrations file written before the node's record marked
        # released: the agent's core starts from them.
        self.released_at_load: set[JobKey] = set()
        if state_path is not None:
            self._load(state_path)

    def register(self, group: str, job: str, pid: int) -> None:
        check_may_manage(pid)
        for key, pids in self._pids.items():
            if pid in pids and key != (group, job):
                raise RegistrationRefused(
                    f"process {pid} is registered to {key[0]}/{key[1]} already"
                )
        new = pid not in self._pids[(group, job)]
        self._pids[(group, job)].add(pid)
        self._started[pid] = start_time(pid)
        self._gone.discard((group, job))
        self._exited.discard((group, job))
        self._save()
        for listener in self.on_register:
            listener(group, job, new)

    def groups(self) -> list[str]:
        self.forget_exited()
        return sorted({g for (g, _), pids in self._pids.items() if pids})

    def jobs(self, group: str) -> list[str]:
        self.forget_exited()
        return sorted(job for (g, job), pids in self._pids.items() if g == group and pids)

    def processes(self, group: str, job: str) -> list[int]:
        """The job's live registered processes and all their descendants."""
        self.forget_exited()
        tree: list[int] = []
        for pid in sorted(self._pids.get((group, job), set())):
            tree += [p for p in descendants(pid) if p not in tree and alive(p)]
        return tree

    def decided_by(self, released: Callable[[str, str], bool]) -> None:
        """Who says whether a job was released here (the node's core)."""
        self._released_by = released

    def released(self, group: str, job: str) -> bool:
        """The job left its group and its processes here were let go."""
        return self._released_by(group, job)

    def forget(self, group: str, job: str) -> list[int]:
        """Drop the job's registrations (its processes are no longer switched
        here); returns the registered processes that were dropped."""
        pids = sorted(self._pids.pop((group, job), set()))
        self._save()
        return pids

    def gone(self, group: str, job: str) -> bool:
        """The job registered processes here and every one of them has exited."""
        self.forget_exited()
        return (group, job) in self._gone

    def forget_exited(self) -> None:
        changed = False
        for key in list(self._pids):
            living = {pid for pid in self._pids[key] if self._same_process(pid)}
            changed |= living != self._pids[key]
            self._pids[key] = living
            if not living:
                self._gone.add(key)
                self._exited.add(key)
                del self._pids[key]
        if changed:
            self._save()

    def take_exited(self) -> list[JobKey]:
        """The jobs whose registered processes have all exited here since the
        last call, or before this agent started: each is returned once."""
        self.forget_exited()
        exited, self._exited = sorted(self._exited), set()
        return exited

    def _same_process(self, pid: int) -> bool:
        started = start_time(pid)
        return bool(started) and started == self._started.get(pid)

    def _load(self, path: Path) -> None:
        try:
            entries = json.loads(path.read_text()) if path.exists() else []
            exited: set[JobKey] = set()
            for entry in entries:
                pid, started = int(entry["pid"]), str(entry["started"])
                key = (str(entry["group"]), str(entry["job"]))
                exited.add(key)  # until one of its processes is found alive
                if entry.get("released"):
                    self.released_at_load.add(key)
                if started and start_time(pid) == started:
                    self._pids[key].add(pid)
                    self._started[pid] = started
        except (OSError, ValueError, TypeError, KeyError) as error:
            log.warning(
                "registrations in %s are unreadable (%s); processes must register again",
                path, error,
            )  # fmt: skip
            self._pids.clear()
            exited = set()
        # Jobs whose processes all ended while no agent was here to see it.
        self._exited = {key for key in exited if key not in self._pids}
        self._gone |= self._exited
        if self._pids:
            log.info("registrations kept from before the restart: %s", self.describe())
        self._save()

    def _save(self) -> None:
        if self._state_path is None:
            return
        entries = [
            {"group": group, "job": job, "pid": pid, "started": self._started.get(pid, "")}
            for (group, job), pids in sorted(self._pids.items())
            for pid in sorted(pids)
        ]
        partial = self._state_path.with_name(self._state_path.name + ".partial")
        try:
            self._state_path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(entries))
            partial.replace(self._state_path)
        except OSError as error:
            log.warning(
                "cannot keep registrations in %s (%s): after a restart of this agent, "
                "job processes must register again; give the agent a writable socket directory",
                self._state_path, error,
            )  # fmt: skip

    def describe(self) -> str:
        return ", ".join(
            f"{group}/{job} {sorted(pids)}" for (group, job), pids in sorted(self._pids.items())
        )


def _never(group: str, job: str) -> bool:
    return False
