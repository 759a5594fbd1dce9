"""Hears of every workflow task a scheduler fails: a runner around the one
the worker uses, which sees each activation the SDK hands a run, and among
them the eviction that follows a failed task (its reason says whether the
history disagreed with the code, or the code raised). Nothing is polled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import temporalio.bridge.proto.workflow_activation as activation
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

from timeshare.workers.scheduler.healing.wrapped_runner import WrappedInstance, WrappedRunner

RemoveFromCache = activation.RemoveFromCache
# The evictions that end a failed workflow task, and what each says of it.
FAILED_TASK = {
    RemoveFromCache.EvictionReason.NONDETERMINISM: "nondeterminism",
    RemoveFromCache.EvictionReason.LANG_FAIL: "workflow-error",
}


@dataclass(frozen=True)
class TaskFailure:
    workflow_type: str
    workflow_id: str
    run_id: str
    # "nondeterminism" or "workflow-error", and what the SDK said.
    kind: str
    message: str


class _Watched(WrappedInstance):
    heard: Callable[[TaskFailure], None]

    def seen(self, act: activation.WorkflowActivation) -> None:
        for job in act.jobs:
            if not job.HasField("remove_from_cache"):
                continue
            kind = FAILED_TASK.get(job.remove_from_cache.reason)
            if kind is not None:
                info = self.details.info
                failure = TaskFailure(
                    info.workflow_type, info.workflow_id, act.run_id, kind,
                    job.remove_from_cache.message,
                )  # fmt: skip
                self.heard(failure)


class FailureWatch(WrappedRunner):
    """``inner`` with every failed task's eviction reported to ``heard``
    (called on whichever thread runs the activation)."""

    def __init__(self, inner: WorkflowRunner, heard: Callable[[TaskFailure], None]) -> None:
        super().__init__(inner)
        self._heard = heard

    def wrap(self, instance: WorkflowInstance, details: WorkflowInstanceDetails) -> WrappedInstance:
        watched = _Watched(instance, details)
        watched.heard = self._heard
        return watched
