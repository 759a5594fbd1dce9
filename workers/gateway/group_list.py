"""Every running group's status for a list (`timeshare status`, ListGroups).

The groups are asked together, each for a short while: a group that does not
answer (its workflow task failing while it heals, its workers gone) is listed
as degraded with the reason, so one such group never hides the others."""

from __future__ import annotations

import asyncio

from temporalio.client import Client, WorkflowQueryFailedError, WorkflowQueryRejectedError
from temporalio.service import RPCError, RPCStatusCode

from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workers.gateway import messages
from timeshare.workers.gateway.group_client import group_handle
from timeshare.workflows.group import GroupWorkflow

# A served group answers in milliseconds; well below the list's own
# deadline (errors.MESSAGE_SECONDS).
LISTED_GROUP_SECONDS = 5.0


async def listed_statuses(client: Client, groups: list[str]) -> list[pb.GroupStatus]:
    answers = await asyncio.gather(*(listed_status(client, group) for group in groups))
    return [answer for answer in answers if answer is not None]


async def listed_status(client: Client, group: str) -> pb.GroupStatus | None:
    """The group's status; None if it ended since it was listed."""
    query = group_handle(client, group).query(GroupWorkflow.status)
    try:
        return messages.group_status(await asyncio.wait_for(query, LISTED_GROUP_SECONDS))
    except TimeoutError:
        cause = f"no scheduler answered for it within {LISTED_GROUP_SECONDS:g} s"
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return None
        cause = f"Temporal refused its query: {error.message}"
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError) as error:
        cause = f"its query failed: {error}"
    return pb.GroupStatus(
        group=group,
        state="degraded",
        degraded_cause=(
            f"the group does not answer ({cause}); a group whose workflow task fails heals "
            "by itself within a minute: look again, then at the schedulers' logs"
        ),
    )
