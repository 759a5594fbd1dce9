"""WatchTurn: what a holder must hear during its turn (others wait, so renew
the lease; the group asks for the turn back), without costing the group any
history or the scheduler any work.

The group workflow publishes its holder and queue depth as search attributes
and the epoch it asks to yield as a memo field, each only when it changes
(workflows/visibility.py). DescribeWorkflowExecution returns both from the
workflow's current state, answered by Temporal's server alone: no workflow
task, no query to the scheduler worker, no history event. One poller per
group per gateway serves every watch of that group.

Safe across restarts and replicas: the gateway keeps nothing but these
pollers. A watch ends with its stream; a job whose gateway goes away opens
its watch again on another one, and whatever it missed meanwhile is still
published. A job that stops listening is caught by its lease (the group's
record of when it last sent anything), never by this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from timeshare.models import GroupPolicy
from timeshare.names import group_workflow_id
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workflows.group import GroupWorkflow
from timeshare.workflows.visibility import (
    BACKFILL_WAITING_MEMO,
    BACKFILL_YIELD_AT_MEMO,
    HOLDER,
    QUEUE_DEPTH,
    YIELD_EPOCH_MEMO,
    yield_at_from_memo,
)

# A holder hears that it is asked to yield within this (plus a round trip),
# in a group whose policy can ask (a turn limit, preemption by priority).
POLL_SECONDS = 0.25
# In any other group a watch only tells the holder that others wait, so
# that it renews its lease: polled this often, or a sixth of the lease,
# whichever is sooner.
SLOW_POLL_SECONDS = 5.0
# While a backfill job's turn is watched, its group is polled this often:
# every moment the backfill job holds on after a regular job asks (or after
# the group asks it to yield ahead of a predicted request) is a moment the
# regular job waits. One Describe per period, answered by Temporal alone.
BACKFILL_POLL_SECONDS = 0.05
# Groups whose poll interval a gateway remembers (their policies are fixed).
REMEMBERED_GROUPS = 10_000
# A watch says something at least this often, so its client can tell a
# silent stream from a dead one.
KEEPALIVE_SECONDS = 5.0


# The memo field a group's creator sets to poll_seconds of its policy.
WATCH_POLL_MEMO = "watch_poll_seconds"


def poll_seconds(policy: GroupPolicy) -> float:
    """How often a watch of a group with this policy is polled."""
    asks = policy.max_turn_seconds > 0 or policy.preempt_lower_after_seconds > 0
    if asks:
        return POLL_SECONDS
    return max(POLL_SECONDS, min(SLOW_POLL_SECONDS, policy.lease_seconds / 6))


@dataclass(frozen=True)
class GroupFacts:
    """What the group has published."""

    holder: str = ""
    waiting: int = 0
    yield_epoch: int = 0
    # Of those waiting, backfill jobs.
    backfill_waiting: int = 0
    # (epoch, when, in seconds since the epoch) the holder of that epoch, a
    # backfill job, is to be asked to yield.
    backfill_yield_at: tuple[int, float] = (0, 0.0)


def yield_at(facts: GroupFacts, job: str, epoch: int) -> float | None:
    """When the group is to ask ``job``'s turn of ``epoch`` to yield, if it said so ahead."""
    asked_epoch, at = facts.backfill_yield_at
    return at if facts.holder == job and asked_epoch == epoch else None


def notice_of(facts: GroupFacts, job: str, epoch: int, backfill: bool, now: float) -> pb.TurnNotice:
    """What the watch of ``job``'s turn of ``epoch`` tells it at ``now``
    (``backfill``: the job is a backfill job, which any waiter may go before)."""
    holding = facts.holder == job
    due = yield_at(facts, job, epoch)
    return pb.TurnNotice(
        holding=holding,
        epoch=epoch,
        waiting=facts.waiting,
        should_yield=holding and (facts.yield_epoch == epoch or (due is not None and now >= due)),
        only_backfill_waiting=holding
        and not backfill
        and 0 < facts.waiting <= facts.backfill_waiting,
    )


class GroupNotFound(Exception):
    pass


class GroupPoller:
    """Reads one group's published facts while anyone watches: at the
    group's pace, or every BACKFILL_POLL_SECONDS while a backfill turn is watched."""

    def __init__(self, client: Client, group: str, every: float = POLL_SECONDS) -> None:
        self._handle = client.get_workflow_handle(group_workflow_id(group))
        self.policy_every = every
        # Watches of a backfill job's turn: while any runs, BACKFILL_POLL_SECONDS.
        self.backfill_watchers = 0
        self.facts = GroupFacts()
        self.version = 0
        self.error: BaseException | None = None
        self.watchers = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    @property
    def every(self) -> float:
        return BACKFILL_POLL_SECONDS if self.backfill_watchers else self.policy_every

    def start(self) -> bool:
        """Start polling unless it runs; whether this call started it. The
        first read is a period away: the watch that starts the poller reads
        at once itself, and seeds the poller with what it read."""
        if self._task is not None and not self._task.done():
            return False
        self._task = asyncio.get_running_loop().create_task(self._poll())
        return True

    def seed(self, facts: GroupFacts) -> None:
        self.facts, self.error = facts, None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def read(self) -> GroupFacts:
        description = await self._handle.describe()
        attributes = description.typed_search_attributes
        holder = attributes.get(HOLDER) or ""
        return GroupFacts(
            holder="" if holder == "-" else holder,
            waiting=attributes.get(QUEUE_DEPTH) or 0,
            yield_epoch=int(await description.memo_value(YIELD_EPOCH_MEMO, 0)),
            backfill_waiting=int(await description.memo_value(BACKFILL_WAITING_MEMO, 0)),
            backfill_yield_at=yield_at_from_memo(
                await description.memo_value(
                    BACKFILL_YIELD_AT_MEMO, [0, 0.0], type_hint=list[float]
                )
            ),
        )

    async def _poll(self) -> None:
        clock = asyncio.get_running_loop().time
        last = clock()
        while True:
            # Woken often (no call made) so that a backfill watch that starts
            # meanwhile is served at its pace from then on.
            await asyncio.sleep(min(POLL_SECONDS, self.every))
            if clock() - last < self.every:
                continue
            last = clock()
            try:
                facts, error = await self.read(), None
            except RPCError as failure:
                facts, error = self.facts, failure
            if facts != self.facts or error is not self.error:
                async with self._changed:
                    self.facts, self.error = facts, error
                    self.version += 1
                    self._changed.notify_all()

    async def wait_past(self, version: int, timeout: float) -> None:
        """Until the facts change after ``version``, or ``timeout`` passes."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.version > version), timeout
                )


class TurnWatches:
    """The gateway's pollers, one per watched group."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._pollers: dict[str, GroupPoller] = {}
        self._intervals: dict[str, float] = {}

    async def interval(self, group: str) -> float:
        """How often the group's watches are polled, from its policy (read
        once per group: a policy is fixed when its group is created). From
        the memo its creator set (one Describe, answered by Temporal alone);
        a group created before that memo is asked by a query, a workflow
        task on the scheduler."""
        every = self._intervals.get(group)
        if every is None:
            handle = self._client.get_workflow_handle_for(
                GroupWorkflow.run, group_workflow_id(group)
            )
            try:
                description = await handle.describe()
                every = await description.memo_value(WATCH_POLL_MEMO, None, type_hint=float)
                if every is None:
                    every = poll_seconds((await handle.query(GroupWorkflow.status)).policy)
            except RPCError as error:
                if error.status == RPCStatusCode.NOT_FOUND:
                    raise GroupNotFound(group) from None
                raise
            if len(self._intervals) >= REMEMBERED_GROUPS:
                self._intervals.pop(next(iter(self._intervals)))
            self._intervals[group] = every
        return every

    @contextlib.asynccontextmanager
    async def polling(
        self, group: str, backfill: bool = False
    ) -> AsyncIterator[tuple[GroupPoller, bool]]:
        """The group's poller, and whether this watch started it."""
        poller = self._pollers.get(group)
        if poller is None:
            every = await self.interval(group)
            poller = self._pollers.get(group) or GroupPoller(self._client, group, every)
            self._pollers[group] = poller
        poller.watchers += 1
        poller.backfill_watchers += backfill
        started = poller.start()
        try:
            yield poller, started
        finally:
            poller.watchers -= 1
            poller.backfill_watchers -= backfill
            if poller.watchers == 0:
                del self._pollers[group]
                await poller.stop()

    async def notices(
        self, group: str, job: str, epoch: int, backfill: bool = False
    ) -> AsyncGenerator[pb.TurnNotice, None]:
        """The watch of one turn: a notice at once, then on every change and at
        least every KEEPALIVE_SECONDS. Raises GroupNotFound for a group that
        does not run."""
        async with self.polling(group, backfill) as (poller, started):
            # The first notice is read fresh: a new turn must not be told of
            # the previous one's facts. A poller this watch started reads a
            # period later, so this one read serves both.
            try:
                facts = await poller.read()
            except RPCError as error:
                if error.status == RPCStatusCode.NOT_FOUND:
                    raise GroupNotFound(group) from None
                raise
            if started:
                poller.seed(facts)
            version = poller.version
            while True:
                yield notice_of(facts, job, epoch, backfill, time.time())
                # Woken when the group's yield request comes due, to say so then.
                due, now = yield_at(facts, job, epoch), time.time()
                until_due = due - now if due is not None and due > now else KEEPALIVE_SECONDS
                await poller.wait_past(version, min(KEEPALIVE_SECONDS, until_due))
                version, facts = poller.version, poller.facts
                failed = poller.error
                if isinstance(failed, RPCError) and failed.status == RPCStatusCode.NOT_FOUND:
                    raise GroupNotFound(group)
