"""The agent evicts a job from its group once every process it registered on
this node has exited (killed, crashed, or ended without leaving).

A job that ends normally leaves its group from inside (an integration's exit
hook, ``Job.leave()``); SIGKILL and the OOM killer run no such code. Without
this watch the killed job's turn stays held until its lease runs out: minutes
of an idle GPU with the other jobs waiting.

A job is evicted only after its processes have stayed gone for a grace
period, so that a worker that restarts and registers again keeps its place.
A job that left its group, or was released here, is not evicted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from timeshare.activities.backends.processes import JobKey, ProcessTable

log = logging.getLogger("timeshare.agent")

# How often the agent looks for jobs whose processes are all gone.
WATCH_SECONDS = 1.0
# How long a job's processes stay gone before the job is evicted.
GRACE_SECONDS = 2.0
# Tries to evict one job before the agent gives up and says so.
EVICT_TRIES = 10

# (group, job, reason) -> whether the job was in its group.
Evict = Callable[[str, str, str], Awaitable[bool]]
# (group, job) whose processes all exited -> whether it is a member here, to
# be evicted (the node's core says: SwitchActivities.processes_exited).
StillMember = Callable[[str, str], bool]


def always(group: str, job: str) -> bool:
    return True


@dataclass
class ExitWatch:
    node: str
    processes: ProcessTable
    evict: Evict
    still_member: StillMember = always
    grace_seconds: float = GRACE_SECONDS
    clock: Callable[[], float] = time.monotonic
    # Jobs seen gone, with when they were first seen and the failed tries so far.
    _pending: dict[JobKey, tuple[float, int]] = field(default_factory=dict)

    async def check(self) -> list[JobKey]:
        """One look: evict the jobs gone for longer than the grace; returns them."""
        now = self.clock()
        for key in self.processes.take_exited():
            if self.still_member(*key):
                self._pending.setdefault(key, (now, 0))
        evicted = []
        for key, (since, tries) in sorted(self._pending.items()):
            if not self.processes.gone(*key):
                del self._pending[key]  # a process of the job registered again
            elif now - since >= self.grace_seconds and await self._evict(key, tries):
                evicted.append(key)
        return evicted

    async def _evict(self, key: JobKey, tries: int) -> bool:
        group, job = key
        reason = f"all of its processes on node {self.node} exited"
        try:
            member = await self.evict(group, job, reason)
        except Exception as error:
            if tries + 1 < EVICT_TRIES:
                self._pending[key] = (self._pending[key][0], tries + 1)
                return False
            log.warning(
                "job %s/%s: its processes on node %s exited, and evicting it failed %d times "
                "(last: %s); its lease will end its turn, or run `timeshare evict %s %s`",
                group, job, self.node, EVICT_TRIES, error, group, job,
            )  # fmt: skip
            del self._pending[key]
            return False
        del self._pending[key]
        if member:
            log.info("job %s/%s evicted: %s", group, job, reason)
        return member

    async def run(self, stop: asyncio.Event, every: float = WATCH_SECONDS) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
            if not stop.is_set():
                await self.check()
