"""The ``app`` backend: the job's own workload hooks (timeshare.hooks) put
its device state away and bring it back. Every process of the job on this
node that serves hooks is called at once, so hooks that tear down collective
communicators (the nccl hook) can meet. Stacked first (`app+cuda`), it lets
the CUDA checkpoint move only what the application left on the device.

A job whose hooks fail is the job's own fault (HookFailed): the scheduler
evicts it, and from its release here on its hooks are not called again, so
that they cannot fail the switches of the jobs that remain (a device layer,
`app+cuda`, then moves its state whole). Admitted again, it is called again."""

from __future__ import annotations

import asyncio
import time

from timeshare.activities.backends.base import (
    HOOKS,
    Backend,
    BackendConfig,
    BackendError,
    HookFailed,
    Released,
)
from timeshare.activities.backends.hook_registry import HookRegistry
from timeshare.hooks.protocol import EvictMode, HookName
from timeshare.models import BackendAction


class AppBackend(Backend):
    name = "app"
    evict_order = HOOKS

    def __init__(self, config: BackendConfig) -> None:
        self.node = config.node
        self.timeout = config.hook_timeout_seconds
        self.hooks = HookRegistry()
        # Jobs whose last hook call failed, and those of them released since.
        self._failing: set[tuple[str, str]] = set()
        self._given_up: set[tuple[str, str]] = set()

    @classmethod
    def create(cls, config: BackendConfig) -> AppBackend:
        return cls(config)

    def attach_hooks(self, hooks: HookRegistry) -> None:
        self.hooks = hooks
        hooks.accepting = True

    def describe(self) -> str:
        return f"app (workload hooks, {self.timeout:g} s per call)"

    async def resident_jobs(self, group: str) -> list[str]:
        return [
            job
            for job in self.hooks.jobs(group)
            if (group, job) not in self._given_up
            and any(not c.evicted for c in self.hooks.connections(group, job))
        ]

    def evict_mode(self, group: str, job: str) -> EvictMode | None:
        connections = self.hooks.connections(group, job)
        return connections[0].mode if connections else None

    async def lock(self, group: str, job: str) -> BackendAction:
        # The job's state stays on the device: nothing for its hooks to do.
        return BackendAction(job=job, action="noop")

    async def quiesce(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        # The hooks go first, on every node: they may tear down communicators
        # between the job's ranks, which takes every rank running.
        return await self.checkpoint(group, job, mode)

    async def checkpoint(self, group: str, job: str, mode: EvictMode = "offload") -> BackendAction:
        if (group, job) in self._given_up:
            return BackendAction(job=job, action="noop")
        return await self._call_all(group, job, "evict", mode)

    async def restore(self, group: str, job: str) -> BackendAction:
        # Admitted: the job is back in its group, hooks and all.
        self._given_up.discard((group, job))
        return await self._call_all(group, job, "admit", None)

    async def release(self, group: str, job: str, restore: bool = True) -> Released:
        """The job left its group: what its hooks put away comes back (a
        sleeping vLLM or SGLang engine wakes, offloaded tensors return), as
        at an admission, unless ``restore`` is off (its device state is still
        parked, or the device is another job's). Hooks that failed are not
        called again."""
        key = (group, job)
        if key in self._failing:
            self._given_up.add(key)
            return Released(done=["its failing hooks are not called again"])
        if not restore:
            evicted = [c.pid for c in self.hooks.connections(group, job) if c.evicted]
            return Released(
                done=[f"admit hooks of {evicted} not called: its device state is still parked"]
                if evicted
                else []
            )
        try:
            woke = await self._call_all(group, job, "admit", None)
        except HookFailed as failed:
            self._given_up.add(key)
            return Released(done=[f"{failed}; its hooks are not called again"])
        return Released(done=[f"admit hooks of {woke.pids} ran"] if woke.action != "noop" else [])

    async def _call_all(
        self, group: str, job: str, hook: HookName, mode: EvictMode | None
    ) -> BackendAction:
        evicting = hook == "evict"
        targets = [c for c in self.hooks.connections(group, job) if c.evicted != evicting]
        if not targets:
            return BackendAction(job=job, action="noop")
        start = time.time()
        results = await asyncio.gather(
            *(c.call(hook, mode, self.timeout) for c in targets), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, BackendError):
                raise result
        failures = [str(r) for r in results if isinstance(r, BackendError)]
        if failures:
            self._failing.add((group, job))
            raise HookFailed(group, job, "; ".join(failures))
        self._failing.discard((group, job))
        return BackendAction(
            job=job,
            action="checkpoint" if evicting else "restore",
            seconds=time.time() - start,
            pids=sorted(c.pid for c in targets),
        )
