"""A hook for multi-rank jobs: tear down the job's collective communicators
(NCCL process groups) before its state leaves the GPU, and re-create them
after it is back, so that the CUDA checkpoint then runs on each rank with no
communicator open (cuda-checkpoint cannot save NCCL's connections).

The agent calls every rank's hooks on a node at once, and every node's at
once, so ranks tear down and re-create together; a teardown or a re-creation
that waits for all ranks must finish within the agent's hook timeout.

``create`` re-creates the groups the job uses (for instance
`torch.distributed.init_process_group(...)` and its subgroups) and points the
job at the new ones; ``destroy`` tears them down (default:
`torch.distributed.destroy_process_group()`, every group). Other hooks of the
same process (a model offload) go in ``inner``: they run before the teardown
and after the re-creation."""

from __future__ import annotations

from collections.abc import Callable

from timeshare.hooks import WorkloadHooks
from timeshare.hooks.protocol import EvictMode


def destroy_all_groups() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class NcclHooks(WorkloadHooks):
    def __init__(
        self,
        create: Callable[[], None],
        destroy: Callable[[], None] = destroy_all_groups,
        inner: WorkloadHooks | None = None,
    ) -> None:
        self.create = create
        self.destroy = destroy
        self.inner = inner

    def evict(self, mode: EvictMode) -> None:
        if self.inner is not None:
            self.inner.evict(mode)
        self.destroy()

    def admit(self) -> None:
        self.create()
        if self.inner is not None:
            self.inner.admit()
