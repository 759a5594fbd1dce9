"""A workflow runner around another, whose instances see each activation
before the inner instance runs it: how the healer hears of failed tasks
(failure_watch.py) and reads a replay's state between tasks
(replayed_state.py) through the SDK's public runner interface."""

from __future__ import annotations

from typing import Any

import temporalio.bridge.proto.workflow_activation as activation
import temporalio.bridge.proto.workflow_completion as completion
from temporalio import workflow
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner


class WrappedInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, details: WorkflowInstanceDetails) -> None:
        self.inner, self.details = inner, details

    def seen(self, act: activation.WorkflowActivation) -> None:
        """Called with each activation before the inner instance runs it."""

    def activate(
        self, act: activation.WorkflowActivation
    ) -> completion.WorkflowActivationCompletion:
        self.seen(act)
        return self.inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> Any:
        return self.inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self.inner.get_external_store_context(command_info)

    def get_info(self) -> workflow.Info:
        return self.inner.get_info()

    def get_thread_id(self) -> int | None:
        return self.inner.get_thread_id()


class WrappedRunner(WorkflowRunner):
    def __init__(self, inner: WorkflowRunner) -> None:
        self.inner = inner

    def wrap(self, instance: WorkflowInstance, details: WorkflowInstanceDetails) -> WrappedInstance:
        raise NotImplementedError

    def prepare_workflow(self, defn: Any) -> None:
        self.inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return self.wrap(self.inner.create_instance(det), det)

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self.inner.set_worker_level_failure_exception_types(types)
