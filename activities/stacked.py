"""Backends stacked with "+": `--backend freeze+cuda` freezes a job's
processes, then checkpoints their device state; `--backend app+cuda` calls
the job's hooks (which put away what the application can), then checkpoints
what remains. A restore runs the other way round. The app layer goes first:
its hooks need the job's processes running."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from timeshare.activities.backend import Backend, BackendConfig, BackendNotFound, DeviceBytes
from timeshare.activities.hook_registry import HookRegistry
from timeshare.activities.processes import ProcessTable
from timeshare.hooks.protocol import EvictMode
from timeshare.models import BackendAction

Found = TypeVar("Found")
# The action a stack reports: the strongest any layer took.
STRENGTH = ("checkpoint", "restore", "lock", "unlock")


class StackedBackend(Backend):
    name = "stacked"

    def __init__(self, layers: list[Backend]) -> None:
        if any(layer.name == "app" for layer in layers[1:]):
            raise BackendNotFound(
                "the app backend must come first in a stack (app+cuda): its hooks run "
                "before the other layers stop the job's processes"
            )
        self.layers = layers
        self.name = "+".join(layer.name for layer in layers)  # type: ignore[misc]
        self.simulated = any(layer.simulated for layer in layers)  # type: ignore[misc]

    @classmethod
    def create(cls, config: BackendConfig) -> StackedBackend:
        raise NotImplementedError("stack backends with load_backend('a+b', config)")

    def attach(self, processes: ProcessTable) -> None:
        for layer in self.layers:
            layer.attach(processes)

    def attach_hooks(self, hooks: HookRegistry) -> None:
        for layer in self.layers:
            layer.attach_hooks(hooks)

    def describe(self) -> str:
        return " + ".join(layer.describe() for layer in self.layers)

    def gpus(self) -> list[str]:
        return next((gpus for layer in self.layers if (gpus := layer.gpus())), [])

    def co_residency(self) -> bool:
        return any(layer.co_residency() for layer in self.layers)

    def evict_mode(self, group: str, job: str) -> EvictMode | None:
        return next((m for layer in self.layers if (m := layer.evict_mode(group, job))), None)

    async def footprint(self, group: str, job: str) -> DeviceBytes | None:
        return await _first(lambda layer: layer.footprint(group, job), self.layers)

    async def admission_footprint(self, group: str, job: str) -> DeviceBytes | None:
        return await _first(lambda layer: layer.admission_footprint(group, job), self.layers)

    async def free_memory(self, group: str) -> DeviceBytes | None:
        return await _first(lambda layer: layer.free_memory(group), self.layers)

    async def resident_jobs(self, group: str) -> list[str]:
        resident: set[str] = set()
        for layer in self.layers:
            resident.update(await layer.resident_jobs(group))
        return sorted(resident)

    async def lock(self, group: str, job: str) -> BackendAction:
        return combined(job, [await layer.lock(group, job) for layer in self.layers])

    async def quiesce(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        actions = [await layer.quiesce(group, job, mode) for layer in self.layers]
        return combined(job, actions)

    async def checkpoint(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        actions = [await layer.checkpoint(group, job, mode) for layer in self.layers]
        return combined(job, actions)

    async def restore(self, group: str, job: str) -> BackendAction:
        actions = [await layer.restore(group, job) for layer in reversed(self.layers)]
        return combined(job, actions)


async def _first(
    ask: Callable[[Backend], Awaitable[Found | None]], layers: list[Backend]
) -> Found | None:
    for layer in layers:
        answer = await ask(layer)
        if answer is not None:
            return answer
    return None


def combined(job: str, actions: list[BackendAction]) -> BackendAction:
    done = [a for a in actions if a.action != "noop"]
    if not done:
        return BackendAction(job=job, action="noop")
    return BackendAction(
        job=job,
        action=min((a.action for a in done), key=STRENGTH.index),
        bytes=sum(a.bytes for a in done),
        seconds=sum(a.seconds for a in done),
        pids=sorted({pid for a in done for pid in a.pids}),
    )
