"""A stand-in for a scheduler that cannot replay a group's history (the SDK
bug of docs/reliability.md, or an upgrade that changed the workflow without
a patch): `timeshare scheduler`, whose workflow code disagrees with one run
named in TIMESHARE_BENCH_DISAGREE_WITH_RUN and agrees with every other.
bench chaos's ``stuck-group`` fault runs every scheduler replica as this one
until the group has healed.

    TIMESHARE_BENCH_DISAGREE_WITH_RUN=RUN python -m bench.parts.disagreeing_scheduler \\
        --temporal HOST:PORT
"""

from __future__ import annotations

import argparse
import os
from functools import partial

from temporalio import workflow

from timeshare.workers.common.children import die_with_parent_if_asked
from timeshare.workers.common.service import run_service
from timeshare.workers.common.temporal_settings import TemporalSettings
from timeshare.workers.scheduler.serve import serve_scheduler
from timeshare.workflows.group import GroupInput, GroupWorkflow

RUN_VARIABLE = "TIMESHARE_BENCH_DISAGREE_WITH_RUN"
# Read once, as the process starts: the same for every replay it makes.
DISAGREE_WITH = os.environ.get(RUN_VARIABLE, "")


@workflow.defn(name="GroupWorkflow")
class GroupWorkflowDisagreeingWithOneRun(GroupWorkflow):
    """Writes a memo as the named run starts, which its history lacks: every
    task of that run fails here; every other run is GroupWorkflow's own."""

    @workflow.init
    def __init__(self, input: GroupInput) -> None:
        super().__init__(input)

    @workflow.run
    async def run(self, input: GroupInput) -> None:
        if workflow.info().run_id == DISAGREE_WITH:
            workflow.upsert_memo({"disagrees": True})
        await super().run(input)


def main() -> None:
    die_with_parent_if_asked()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temporal", required=True, help="Temporal's HOST:PORT")
    args = parser.parse_args()
    serve = partial(
        serve_scheduler,
        temporal=TemporalSettings(address=args.temporal),
        group_workflows=[GroupWorkflowDisagreeingWithOneRun],
    )
    run_service("scheduler", lambda stop: serve(stop))


if __name__ == "__main__":
    main()
