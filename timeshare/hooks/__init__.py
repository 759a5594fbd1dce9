"""Workload hooks: a job process tells its node agent how to put its GPU
state away and bring it back, and the agent calls it on every switch.

    from timeshare.hooks import serve_hooks
    from timeshare.hooks.vllm import VllmHooks

    hooks = serve_hooks(VllmHooks(llm), "grpo-pair", "job-a")

The process presents the job's token (from a Join in this process, else
TIMESHARE_JOB_TOKEN, or ``token=``): the agent serves no one else's hooks for
a job. The agent calls ``evict(mode)`` before the job's state leaves the GPU and
``admit()`` once it is back, from a background thread that holds one
connection to the agent's Unix socket (and reconnects if the agent restarts).
A hook that raises fails the switch with its message; one that takes longer
than the agent's hook timeout fails it too. An evict hook that keeps failing
gets its own job evicted, so the rest of the group goes on. Ready-made hooks live in
submodules (vllm, sglang, torch_offload, nccl), imported only when used.

The agent must run a backend that calls hooks: `--backend app+cuda` (hooks,
then the CUDA checkpoint of whatever they left on the device) or `app`.
"""

from __future__ import annotations

import abc

from timeshare.hooks._channel import HookServer, serve_hooks
from timeshare.hooks.protocol import EvictMode


class WorkloadHooks(abc.ABC):
    """What a job does when its GPU state must leave the device and when it
    comes back. Both are called from the hook thread, one at a time."""

    @abc.abstractmethod
    def evict(self, mode: EvictMode) -> None:
        """Release the job's device memory: ``offload`` keeps the contents in
        host memory, ``discard`` may drop what can be rebuilt."""

    @abc.abstractmethod
    def admit(self) -> None:
        """Bring back what ``evict`` put away; the job runs again after this."""


__all__ = ["EvictMode", "HookServer", "WorkloadHooks", "serve_hooks"]
