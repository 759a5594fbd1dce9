"""One GPU set's device memory in the model: which of a group's jobs are on
the device (running or locked beside another: co-residency) and which are
parked in host memory, and what each switch moves.

It follows the node agent's switch (activities/switch.py) and the sim
backend: a switch checkpoints what must leave, least recently run first and
only until the admitted job fits where co-residency is on, locks what stays,
then restores (or only unlocks) the admitted job. A job never checkpointed
has nothing to bring back. Transfers run one after another at the set's
bandwidth, spread over the job's GPUs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

from timeshare.node.room import extra, plan_room

Location = Literal["running", "locked", "host"]
DEVICE = "gpu"


@dataclass(frozen=True)
class SwitchCost:
    seconds: float
    bytes_moved: int
    # The admitted job's state came back from host memory (Grant.context_restored).
    restored: bool
    checkpointed: dict[str, int]


@dataclass
class Device:
    sizes: dict[str, int]
    gpus: dict[str, int]
    bandwidth: float
    # Bytes co-resident states may fill; None: one job at a time.
    room: int | None
    location: dict[str, Location] = field(default_factory=dict)
    host_bytes: dict[str, int] = field(default_factory=dict)
    peak_host_bytes: int = 0
    _last_ran: dict[str, int] = field(default_factory=dict)
    _clock: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def on_device(self) -> list[str]:
        return sorted(job for job, where in self.location.items() if where != "host")

    def switch(self, admit: str, evict: list[str]) -> SwitchCost:
        keep, leave = self._room(admit, evict)
        seconds = 0.0
        checkpointed: dict[str, int] = {}
        for job in keep:
            if self.location.get(job) == "running":
                self.location[job] = "locked"
        for job in leave:
            if self.location.get(job, "host") == "host":
                continue  # a checkpoint of a parked job does nothing
            moved = self.sizes[job]
            checkpointed[job] = moved
            seconds += self._transfer(job, moved)
            self.location[job] = "host"
            self.host_bytes[job] = moved
        # Until the admitted job's copy is back, every parked state is in host memory.
        self.peak_host_bytes = max(self.peak_host_bytes, sum(self.host_bytes.values()))
        restored = 0
        if admit and self.location.get(admit) != "running":
            if self.location.get(admit) != "locked":
                restored = self.host_bytes.pop(admit, 0)
                seconds += self._transfer(admit, restored)
            self.location[admit] = "running"
            self._last_ran[admit] = next(self._clock)
        return SwitchCost(
            seconds=seconds,
            bytes_moved=restored + sum(checkpointed.values()),
            restored=restored > 0,
            checkpointed=checkpointed,
        )

    def _room(self, admit: str, evict: list[str]) -> tuple[list[str], list[str]]:
        """Which of the group's other jobs stay (locked) and which leave."""
        seen = self.on_device()
        others = sorted((set(evict) | set(seen)) - {admit})
        if self.room is None:
            return [], others
        if not admit:
            return others, []
        need = extra({DEVICE: self.sizes[admit]}, self._footprint(admit))
        used = sum(self.sizes[job] for job in seen)
        on_device = sorted((j for j in others if j in seen), key=lambda j: self._last_ran.get(j, 0))
        plan = plan_room(
            need,
            {DEVICE: self.room - used},
            on_device,
            {job: self._footprint(job) for job in on_device},
        )
        return plan.keep, plan.evict + [j for j in others if j not in seen]

    def _footprint(self, job: str) -> dict[str, int]:
        return {DEVICE: self.sizes[job]} if self.location.get(job, "host") != "host" else {}

    def _transfer(self, job: str, moved: int) -> float:
        return moved / (self.bandwidth * self.gpus.get(job, 1))
