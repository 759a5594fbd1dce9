"""Narrows each group's GPU claim on this node to the GPUs its processes use.

A group that names no GPUs claims all of the node's at its first join (and an
llm-d group, unplaced, likewise), which keeps every other group off the node.
Once its registered processes show on GPUs in NVML, the claim narrows to
those, so another group can join on the GPUs left. A GPU stays claimed while
any of the group's processes holds state of it: a process whose state is
checkpointed to host memory is not listed by NVML, so each process's GPUs
are remembered from when it was last seen, for as long as it lives."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from timeshare.activities.backends.gpus import DeviceMemory
from timeshare.activities.backends.processes import ProcessTable
from timeshare.workflows.registry import NarrowInput

log = logging.getLogger("timeshare.agent")
# How often NVML is read for it: a join that waits for the narrowing waits this long.
NARROW_EVERY_SECONDS = 2.0
# Sent again this often even unchanged: a group that joined again claims all anew.
RESEND_SECONDS = 30.0


class ClaimNarrowing:
    def __init__(
        self,
        node: str,
        processes: ProcessTable,
        read_memory: Callable[[], dict[str, DeviceMemory]],
        send: Callable[[NarrowInput], Awaitable[None]],
    ) -> None:
        self.node = node
        self.processes = processes
        self.read_memory = read_memory
        self.send = send
        self._seen: dict[int, set[int]] = {}
        self._sent: dict[str, tuple[list[int], float]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.check()
            except Exception as error:  # the claim stays wide until the next check
                log.warning("narrowing GPU claims on node %s: %s", self.node, error)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), NARROW_EVERY_SECONDS)

    async def check(self) -> None:
        memory = await asyncio.to_thread(self.read_memory)
        if not memory:
            return  # no NVML: the claims stay as joined
        live: set[int] = set()
        for group in self.processes.groups():
            pids = {p for job in self.processes.jobs(group)
                    for p in self.processes.processes(group, job)}  # fmt: skip
            live |= pids
            for name, gpu in memory.items():
                for pid in pids & set(gpu.by_pid):
                    self._seen.setdefault(pid, set()).add(int(name.removeprefix("gpu")))
            used = sorted({index for pid in pids for index in self._seen.get(pid, set())})
            sent, at = self._sent.get(group, ([], 0.0))
            now = asyncio.get_running_loop().time()
            if used and (used != sent or now - at > RESEND_SECONDS):
                await self.send(NarrowInput(group=group, node=self.node, gpus=used))
                self._sent[group] = (used, now)
                if used != sent:
                    log.info("group %s uses GPUs %s of node %s: its claim narrows to them",
                             group, used, self.node)  # fmt: skip
        self._seen = {pid: gpus for pid, gpus in self._seen.items() if pid in live}
        self._sent = {group: gpus for group, gpus in self._sent.items()
                      if group in self.processes.groups()}  # fmt: skip
