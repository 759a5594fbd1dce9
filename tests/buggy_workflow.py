"""A GroupWorkflow with a bug planted in one handler, for tests of what a
failing handler leaves behind (tests/integration/test_group_state.py). Kept in a module of
its own: workflow code is imported into Temporal's sandbox."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from timeshare.scheduling import commands as cmd
    from timeshare.scheduling import events as ev
    from timeshare.workflows.group import GroupInput, GroupWorkflow

BUGGY_JOB = "buggy"


@workflow.defn(name="GroupWorkflowWithABug")
class GroupWorkflowWithABug(GroupWorkflow):
    """Its yield of the job named "buggy" changes part of the state, then
    fails as a bug would."""

    @workflow.init
    def __init__(self, input: GroupInput) -> None:
        super().__init__(input)
        core = self._core
        handlers = core._handlers
        yield_turn = handlers[ev.Yield]

        def yield_with_a_bug(event: ev.Yield, now: float) -> list[cmd.Command]:
            if event.job == BUGGY_JOB:
                core.state.paused = True
                core.state.jobs[event.job].turns += 100
                raise KeyError("a bug in the scheduler")
            return yield_turn(event, now)

        handlers[ev.Yield] = yield_with_a_bug

    @workflow.run
    async def run(self, input: GroupInput) -> None:
        await super().run(input)
