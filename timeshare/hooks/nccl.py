"""A hook for multi-rank jobs: tear down the job's collective communicators
(NCCL process groups) before its state leaves the GPU, and re-create them
after it is back, so that the CUDA checkpoint then runs on each rank with no
communicator open (cuda-checkpoint cannot save NCCL's connections).

Only the job's own groups are torn down: ``groups`` returns them (the ones
``create`` made last), and each is destroyed with
`torch.distributed.destroy_process_group(group)`. The default group stays, as
other code in the process (a launcher, a framework) may hold and use it;
``include_default=True`` tears it down too, after the job's groups, and
``create`` must then call `init_process_group` again (with a fresh
rendezvous) before making its groups.

The agent calls every rank's hooks on a node at once, and every node's at
once, so ranks tear down and re-create together; a teardown or a re-creation
that waits for all ranks must finish within the agent's hook timeout. Other
hooks of the same process (a model offload) go in ``inner``: they run before
the teardown and after the re-creation."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from timeshare.hooks import WorkloadHooks
from timeshare.hooks.protocol import EvictMode


class NcclHooks(WorkloadHooks):
    def __init__(
        self,
        create: Callable[[], None],
        groups: Callable[[], Iterable[Any]],
        *,
        include_default: bool = False,
        inner: WorkloadHooks | None = None,
    ) -> None:
        self.create = create
        self.groups = groups
        self.include_default = include_default
        self.inner = inner

    def evict(self, mode: EvictMode) -> None:
        if self.inner is not None:
            self.inner.evict(mode)
        self._destroy()

    def admit(self) -> None:
        self.create()
        if self.inner is not None:
            self.inner.admit()

    def _destroy(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        default = dist.group.WORLD
        own = [group for group in self.groups() if group is not None]
        if any(group is default for group in own) and not self.include_default:
            raise ValueError(
                "NcclHooks: groups() returned the default process group; "
                "pass include_default=True to tear it down too"
            )
        for group in own:
            if group is not default:
                dist.destroy_process_group(group)
        if self.include_default:
            dist.destroy_process_group()
