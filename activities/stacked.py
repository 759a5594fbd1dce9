"""Backends stacked with "+": `--backend freeze+cuda` freezes a job's
processes, then checkpoints their device state; a restore runs the other way
round (restore, then thaw)."""

from __future__ import annotations

from activities.backend import Backend, BackendConfig
from activities.processes import ProcessTable
from timeshare.models import BackendAction


class StackedBackend(Backend):
    name = "stacked"

    def __init__(self, layers: list[Backend]) -> None:
        self.layers = layers
        self.name = "+".join(layer.name for layer in layers)  # type: ignore[misc]
        self.simulated = any(layer.simulated for layer in layers)  # type: ignore[misc]

    @classmethod
    def create(cls, config: BackendConfig) -> StackedBackend:
        raise NotImplementedError("stack backends with load_backend('a+b', config)")

    def attach(self, processes: ProcessTable) -> None:
        for layer in self.layers:
            layer.attach(processes)

    def describe(self) -> str:
        return " + ".join(layer.describe() for layer in self.layers)

    def gpus(self) -> list[str]:
        return next((gpus for layer in self.layers if (gpus := layer.gpus())), [])

    async def resident_jobs(self, group: str) -> list[str]:
        resident: set[str] = set()
        for layer in self.layers:
            resident.update(await layer.resident_jobs(group))
        return sorted(resident)

    async def checkpoint(self, group: str, job: str) -> BackendAction:
        actions = [await layer.checkpoint(group, job) for layer in self.layers]
        return combined(job, actions)

    async def restore(self, group: str, job: str) -> BackendAction:
        actions = [await layer.restore(group, job) for layer in reversed(self.layers)]
        return combined(job, actions)


def combined(job: str, actions: list[BackendAction]) -> BackendAction:
    done = [a for a in actions if a.action != "noop"]
    if not done:
        return BackendAction(job=job, action="noop")
    return BackendAction(
        job=job,
        action=done[-1].action,
        bytes=sum(a.bytes for a in done),
        seconds=sum(a.seconds for a in done),
    )
