"""A GroupWorkflow whose code disagrees with every history that
GroupWorkflow wrote: what a scheduler upgraded without a patch is to the
groups that were running (tests/integration/test_healing.py). Kept in a
module of its own: workflow code is imported into Temporal's sandbox."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from timeshare.workflows.group import GroupInput, GroupWorkflow


@workflow.defn(name="GroupWorkflow")
class DisagreeingGroupWorkflow(GroupWorkflow):
    """Writes a memo as its run starts, which a GroupWorkflow history lacks:
    replaying one, it fails its first workflow task, on every attempt."""

    @workflow.init
    def __init__(self, input: GroupInput) -> None:
        super().__init__(input)

    @workflow.run
    async def run(self, input: GroupInput) -> None:
        workflow.upsert_memo({"disagrees": True})
        await super().run(input)
