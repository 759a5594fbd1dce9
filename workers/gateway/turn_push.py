"""A holder's watch hears its group's news pushed, not polled, where the
holder may be asked to yield: a backfill job's turn, and every turn in a
group whose policy can ask (a turn limit, preemption by priority).

Such a watch used to read the group every 50 ms (a backfill turn) or every
quarter second for as long as the turn was held: the cost grew with time
held, not with anything happening. Instead the gateway sends the group one
``watch_turn`` update for the turn (its argument: what the gateway last
read, scheduling/watch.py ``TurnAsk``). The update waits in the workflow,
costing nothing, and completes in the workflow task where the group asks
the holder to yield (or names the moment it will), where the turn ends,
and, in a group whose policy can ask, where others start or stop waiting.
The gateway then reads the group once, which wakes every watch of it
(turn_watch.GroupPoller.refresh), and waits again; the group is read every
few seconds besides (a keepalive, and elsewhere what tells a backfill
holder that others wait).

Where the scheduler cannot push (one from before ``watch_turn``), or the
update fails for any other reason, the watch goes back to reading the group
at its old pace, as before, for the rest of the turn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError

from timeshare.background import background
from timeshare.names import group_workflow_id
from timeshare.refusals import Refusal
from timeshare.scheduling.watch import TurnAsk, asks
from timeshare.workflows.group import GroupWorkflow

if TYPE_CHECKING:
    # The watch's own parts, which start a push: named for the annotations alone.
    from timeshare.workers.gateway.turn_watch import GroupFacts, GroupPoller

log = logging.getLogger(__name__)


class TurnPush:
    """One turn's pushed news, for as long as its watch runs."""

    def __init__(
        self, client: Client, group: str, job: str, epoch: int, poller: GroupPoller,
        backfill: bool,
    ) -> None:  # fmt: skip
        self._handle = client.get_workflow_handle_for(GroupWorkflow.run, group_workflow_id(group))
        self._group, self._job, self._epoch = group, job, epoch
        self._poller, self._backfill = poller, backfill
        # Whether the watch went back to polling at its old pace.
        self.polling = False
        poller.pushed_watchers += 1

    def _ask(self, facts: GroupFacts) -> TurnAsk:
        asked = facts.record.asked_from(facts.holder, self._job, self._epoch)
        waiting = facts.waiting > 0 if asks(facts.record.poll_seconds) else None
        return TurnAsk(job=self._job, epoch=self._epoch, asked_from=asked, waiting=waiting)

    async def run(self, facts: GroupFacts) -> None:
        ask = self._ask(facts)
        while True:
            version = self._poller.version
            try:
                await self._handle.execute_update(GroupWorkflow.watch_turn, ask)
            except WorkflowUpdateFailedError as failed:
                if not _news_already(failed):
                    return self._poll_instead(failed)
            except WorkflowUpdateRPCTimeoutOrCancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise asyncio.CancelledError from None  # the watch ended
                # The call timed out, not the watch: read the group, wait again.
            except Exception as failed:  # a watch outlives its push
                return self._poll_instead(failed)
            await self._poller.refresh()
            if self._poller.version == version:
                # Read nothing new (Temporal shows a moment later what the
                # group said): look again at the poller's pace.
                await self._poller.wait_past(version, self._poller.every)
            ask = self._ask(self._poller.facts)

    def _poll_instead(self, failure: BaseException) -> None:
        log.warning(
            "the watch of %s/%s's turn of epoch %d polls the group: the scheduler did not "
            "take its watch_turn update (%s)",
            self._group, self._job, self._epoch, _described(failure),
        )  # fmt: skip
        self.polling = True
        self._poller.pushed_watchers -= 1
        self._poller.backfill_watchers += self._backfill

    def end(self) -> None:
        if self.polling:
            self._poller.backfill_watchers -= self._backfill
        else:
            self._poller.pushed_watchers -= 1


def _described(failure: BaseException) -> str:
    cause = failure.__cause__ or failure
    return f"{type(cause).__name__}: {cause}" if str(cause) else repr(cause)


def _news_already(failed: WorkflowUpdateFailedError) -> bool:
    """The group refused the wait because it has news for the turn already."""
    cause = failed.cause
    return isinstance(cause, ApplicationError) and cause.type == Refusal.FAILED_PRECONDITION


@contextlib.asynccontextmanager
async def pushed(
    client: Client, group: str, job: str, epoch: int, poller: GroupPoller, facts: GroupFacts,
    backfill: bool, push: bool,
) -> AsyncIterator[None]:  # fmt: skip
    """While the watch runs: its turn's news pushed, where ``push``
    (scheduling/watch.hears_pushed)."""
    if not push:
        yield
        return
    pushing = TurnPush(client, group, job, epoch, poller, backfill)
    try:
        async with background(pushing.run(facts)):
            yield
    finally:
        pushing.end()
