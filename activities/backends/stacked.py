"""Backends stacked with "+": `--backend freeze+cuda` checkpoints a job's
device state and freezes its processes; `--backend app+cuda` calls the job's
hooks (which put away what the application can), then checkpoints what
remains.

The layers act in their evict order, whatever order the name gives them:

1. hooks (app): they need the job's processes running;
2. device state (cuda, cuda-checkpoint, sim): the CUDA driver carries out a
   lock, a checkpoint and a restore on a thread inside the target process,
   its restore thread, which must therefore run ([README] NVIDIA/cuda-checkpoint;
   checkpoint-restore/criu plugins/cuda/cuda_plugin.c locks and checkpoints
   before it freezes, and resumes that thread around each checkpoint and
   restore). Frozen first, the process could never answer: the lock would
   time out and a checkpoint or restore hang until the call timeout;
3. processes (freeze): stopped last, every process of the job, the CUDA ones
   and those without CUDA (data loaders, compile workers) alike.

A restore runs the other way round: thaw, restore and unlock, then the admit
hooks. A job frozen earlier (a co-residency lock) is thawed before its device
state is checkpointed, and frozen again after.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from timeshare.activities.backends.app import AppBackend
from timeshare.activities.backends.base import (
    DEVICE,
    HOOKS,
    PROCESSES,
    Backend,
    BackendConfig,
    BackendNotFound,
    HostLedger,
    Released,
)
from timeshare.activities.backends.hook_registry import HookRegistry
from timeshare.activities.backends.processes import ProcessTable
from timeshare.hooks.protocol import EvictMode
from timeshare.models import BackendAction, DeviceBytes

Found = TypeVar("Found")
# The action a stack reports: the strongest any layer took.
STRENGTH = ("checkpoint", "restore", "lock", "unlock")


class StackedBackend(Backend):
    name = "stacked"

    def __init__(self, layers: list[Backend]) -> None:
        hooks = [layer for layer in layers if layer.evict_order == HOOKS]
        if hooks and layers[0] is not hooks[0]:
            raise BackendNotFound(
                "the app backend must come first in a stack (app+cuda): its hooks run "
                "before the other layers stop the job's processes"
            )
        self.layers = layers
        # Stable: layers of one kind keep the order the name gives them.
        self.evicting = sorted(layers, key=lambda layer: layer.evict_order)
        self.restoring = list(reversed(self.evicting))
        self.name = "+".join(layer.name for layer in layers)  # type: ignore[misc]
        self.simulated = any(layer.simulated for layer in layers)  # type: ignore[misc]

    @classmethod
    def create(cls, config: BackendConfig) -> StackedBackend:
        raise NotImplementedError("stack backends with load_backend('a+b', config)")

    def _of(self, kind: int) -> list[Backend]:
        return [layer for layer in self.evicting if layer.evict_order == kind]

    def attach(self, processes: ProcessTable) -> None:
        for layer in self.layers:
            layer.attach(processes)

    def attach_hooks(self, hooks: HookRegistry) -> None:
        for layer in self.layers:
            layer.attach_hooks(hooks)

    def attach_host_ledger(self, ledger: HostLedger) -> None:
        for layer in self.layers:
            layer.attach_host_ledger(ledger)

    def describe(self) -> str:
        return " + ".join(layer.describe() for layer in self.layers)

    def gpus(self) -> list[str]:
        return next((gpus for layer in self.layers if (gpus := layer.gpus())), [])

    def co_residency(self) -> bool:
        return any(layer.co_residency() for layer in self.layers)

    def evict_mode(self, group: str, job: str) -> EvictMode | None:
        return next((m for layer in self.layers if (m := layer.evict_mode(group, job))), None)

    def place(self, group: str, gpus: list[int]) -> None:
        for layer in self.layers:
            layer.place(group, gpus)

    def notes(self) -> list[str]:
        return [note for layer in self.layers for note in layer.notes()]

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
        # A job that failed for good is the scheduler's to evict, whatever
        # the other layers see.
        return sorted(job for job in resident if not self.failed(group, job))

    def failed(self, group: str, job: str) -> bool:
        return any(layer.failed(group, job) for layer in self.layers)

    async def stopped(self, group: str, job: str) -> bool:
        for layer in self.layers:
            if await layer.stopped(group, job):
                return True
        return False

    async def lock(self, group: str, job: str) -> BackendAction:
        return combined(job, [await layer.lock(group, job) for layer in self.evicting])

    async def quiesce(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        # With a device layer, stopping a job's processes waits for the
        # checkpoint that follows (the restore thread must run until then):
        # its hooks and a CUDA lock stop it on the device meanwhile.
        stoppers = self._of(PROCESSES) if self._of(DEVICE) else []
        layers = [layer for layer in self.evicting if layer not in stoppers]
        return combined(job, [await layer.quiesce(group, job, mode) for layer in layers])

    async def checkpoint(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        if any([await layer.on_device(group, job) for layer in self._of(DEVICE)]):
            # Thawed first if an earlier lock froze it: the driver needs it
            # running. (Not reported: the action is the checkpoint.)
            for layer in self._of(PROCESSES):
                await layer.restore(group, job)
        actions: list[BackendAction] = []
        hooks = self._of(HOOKS)
        if hooks and await self.stopped(group, job):
            # Locked already (co-residency): its hooks' own CUDA calls would
            # block on the lock, so the device layer moves its state whole.
            hooks = []
        for layer in [*hooks, *self._of(DEVICE), *self._of(PROCESSES)]:
            actions.append(await layer.checkpoint(group, job, mode))
        return combined(job, actions)

    async def restore(self, group: str, job: str) -> BackendAction:
        return combined(job, [await layer.restore(group, job) for layer in self.restoring])

    async def release(self, group: str, job: str, restore: bool = True) -> Released:
        released = Released()
        for layer in self.restoring:
            if isinstance(layer, AppBackend):
                # Last, as at an admission: woken only once its state is back.
                parked = bool(released.checkpointed or released.failed)
                released = released.merged(
                    await layer.release(group, job, restore=restore and not parked)
                )
            else:
                released = released.merged(await layer.release(group, job, restore))
        return released


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
        ranks=[rank for a in done for rank in a.ranks],
    )
