"""The last state a group's code can rebuild from a history: the history
replayed with the scheduler's own workflow code, outside Temporal, and the
group's state kept at the end of each workflow task, up to where the replay
stops agreeing with the history (or to its end)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import temporalio.bridge.proto.workflow_activation as activation
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Replayer,
    UnsandboxedWorkflowRunner,
    WorkflowInboundInterceptor,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowInterceptorClassInput,
)

from timeshare.scheduling.state import GroupState
from timeshare.workers.scheduler.healing.wrapped_runner import WrappedInstance, WrappedRunner


class Rebuildable(Protocol):
    """A group workflow whose state can be read between activations."""

    def durable_state(self) -> GroupState: ...


@dataclass(frozen=True)
class Replayed:
    """``state`` as it was once the workflow task whose started event is
    ``task_started`` completed (0 and None: before the first task, i.e. the
    run's start input); ``failure``: why the replay stopped ("" where the
    whole history replayed)."""

    task_started: int
    state: GroupState | None
    failure: str


@dataclass
class _Capture:
    workflow: Rebuildable | None = None
    # The history length at the start of the workflow task now replaying.
    task: int = 0
    # (task started event id, state at its end) of the last two tasks completed.
    completed: list[tuple[int, GroupState | None]] = field(default_factory=lambda: [(0, None)])

    def state(self) -> GroupState | None:
        if self.workflow is None:
            return None
        return self.workflow.durable_state().model_copy(deep=True)

    def begins(self, act: activation.WorkflowActivation) -> None:
        evicting = any(job.HasField("remove_from_cache") for job in act.jobs)
        if evicting or act.history_length == self.task:
            return
        if self.task:
            self.completed = [*self.completed, (self.task, self.state())][-2:]
        self.task = act.history_length


class _Capturing(WrappedInstance):
    capture: _Capture

    def seen(self, act: activation.WorkflowActivation) -> None:
        self.capture.begins(act)


class _CapturingRunner(WrappedRunner):
    def __init__(self, capture: _Capture) -> None:
        super().__init__(UnsandboxedWorkflowRunner())
        self._capture = capture

    def wrap(self, instance: WorkflowInstance, details: WorkflowInstanceDetails) -> WrappedInstance:
        capturing = _Capturing(instance, details)
        capturing.capture = self._capture
        return capturing


class _Introduce(Interceptor):
    """Hands the workflow object to the capture as its run starts."""

    def __init__(self, capture: _Capture) -> None:
        self._capture = capture

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        capture = self._capture

        class Introduced(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                capture.workflow = workflow.instance()
                return await super().execute_workflow(input)

        return Introduced


async def replayed_state(
    history: WorkflowHistory, workflows: Sequence[type], converter: DataConverter
) -> Replayed:
    """Replay ``history`` with ``workflows`` (a class whose objects are
    Rebuildable runs it). Where the replay fails, the state at the end of
    the task before the one it was replaying when it failed: a task whose
    commands the history disagrees with may be found out only as the next
    one begins."""
    capture = _Capture()
    replayer = Replayer(
        workflows=list(workflows),
        workflow_runner=_CapturingRunner(capture),
        interceptors=[_Introduce(capture)],
        data_converter=converter,
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    if result.replay_failure is None:
        return Replayed(capture.task, capture.state(), "")
    started, state = capture.completed[0]
    failure = result.replay_failure
    return Replayed(started, state, f"{type(failure).__name__}: {failure}")
