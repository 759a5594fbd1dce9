"""A GroupWorkflow with a bug planted in one handler, for tests of what a
failing handler leaves behind (tests/integration/test_group_state.py). Kept in a module of
its own: workflow code is imported into Temporal's sandbox."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from timeshare.workflows.group import GroupInput, GroupWorkflow

BUGGY_JOB = "buggy"


@workflow.defn(name="GroupWorkflowWithABug")
class GroupWorkflowWithABug(GroupWorkflow):
    """Its yield of the job named "buggy" changes part of the state, then
    fails as a bug would."""

    @workflow.init
    def __init__(self, input: GroupInput) -> None:
        super().__init__(input)
        queue = self._core.queue
        release_turn = queue.release

        def release_with_a_bug(job: str, epoch: int, now: float, asks_again: bool = False) -> float:
            if job == BUGGY_JOB:
                queue.state.paused = True
                queue.state.jobs[job].turns += 100
                raise KeyError("a bug in the scheduler")
            return release_turn(job, epoch, now, asks_again)

        queue.release = release_with_a_bug  # type: ignore[method-assign]

    @workflow.run
    async def run(self, input: GroupInput) -> None:
        await super().run(input)
