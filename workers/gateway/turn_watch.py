"""WatchTurn: what a holder must hear during its turn (others wait, so renew
the lease; the group asks for the turn back), without costing the group any
history or the scheduler any work. The gateway only relays: what a holder
must hear is the core's word (timeshare/scheduling/watch.py), published by
the group as one versioned record in its memo beside its holder and queue
depth as search attributes (workflows/visibility.py), each only when it
changes.

DescribeWorkflowExecution returns them all from the workflow's current
state, answered by Temporal's server alone: no workflow task, no query to
the scheduler worker, no history event. One poller per group per gateway
serves every watch of that group, at the pace the record says. Where a
holder may be asked to yield, the group pushes its news instead
(turn_push.py) and the poller only keeps the watch alive.

Safe across restarts and replicas: the gateway keeps nothing but these
pollers. A watch ends with its stream; a job whose gateway goes away opens
its watch again on another one, and whatever it missed meanwhile is still
published. A job that stops listening is caught by its lease (the group's
record of when it last sent anything), never by this module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from temporalio.client import Client, WorkflowExecutionDescription
from temporalio.service import RPCError, RPCStatusCode

from timeshare.models import Grant, PublishedTurn
from timeshare.names import group_workflow_id
from timeshare.scheduling.watch import (
    MEMO_KEY,
    POLL_SECONDS,
    SLOW_POLL_SECONDS,
    WatchRecord,
    asks,
    hears_pushed,
    poll_seconds,
)
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workers.gateway import messages
from timeshare.workers.gateway.server_clock import ServerClock
from timeshare.workers.gateway.turn_push import pushed
from timeshare.workflows.group import GroupWorkflow
from timeshare.workflows.visibility import HOLDER, QUEUE_DEPTH
from timeshare.workflows.watch_memo import (
    BACKFILL_WAITING_MEMO,
    BACKFILL_YIELD_AT_MEMO,
    WATCH_POLL_MEMO,
    YIELD_EPOCH_MEMO,
    yield_at_from_memo,
)

# Groups whose poll interval a gateway remembers (their policies are fixed).
REMEMBERED_GROUPS = 10_000
# Grants delivered whose turns' watches have not started yet (each is
# forgotten when its watch starts, or when this many newer ones came after).
REMEMBERED_GRANTS = 10_000
# A watch says something at least this often, so its client can tell a
# silent stream from a dead one.
KEEPALIVE_SECONDS = 5.0


@dataclass(frozen=True)
class GroupFacts:
    """What the group has published."""

    holder: str = ""
    waiting: int = 0
    record: WatchRecord = field(default_factory=WatchRecord)

    def notice(self, job: str, epoch: int, backfill: bool, now: float) -> pb.TurnNotice:
        """The record's word to the watch of ``job``'s turn of ``epoch``."""
        said = self.record.notice(self.holder, self.waiting, job, epoch, backfill, now)
        return messages.turn_notice(said)


async def record_of(description: WorkflowExecutionDescription, pace: float) -> WatchRecord:
    """The group's record; for a run from before it, the one its three memo
    keys made (``pace``: its watches' poll interval, read once per group)."""
    record = await description.memo_value(MEMO_KEY, None, type_hint=WatchRecord)
    if record is not None:
        return record
    return WatchRecord.from_legacy_memo(
        yield_epoch=int(await description.memo_value(YIELD_EPOCH_MEMO, 0)),
        backfill_waiting=int(await description.memo_value(BACKFILL_WAITING_MEMO, 0)),
        backfill_yield_at=yield_at_from_memo(
            await description.memo_value(BACKFILL_YIELD_AT_MEMO, [0, 0.0], type_hint=list[float])
        ),
        poll_seconds=pace,
    )


class GroupNotFound(Exception):
    pass


class GroupPoller:
    """Reads one group's published facts while anyone watches, as often as
    its record says a watch of a regular or of a backfill turn must look."""

    def __init__(self, client: Client, group: str, every: float = POLL_SECONDS) -> None:
        self._handle = client.get_workflow_handle(group_workflow_id(group))
        # The pace of a group whose run publishes no record yet (read once per group).
        self.pace = every
        # Watches of a backfill job's turn that poll: while any runs, the
        # record's backfill pace.
        self.backfill_watchers = 0
        # Watches that hear the group's news pushed (turn_push.py): while
        # every watch does, the poll is only a keepalive.
        self.pushed_watchers = 0
        self.facts = GroupFacts(record=WatchRecord(poll_seconds=every))
        self.version = 0
        self.error: BaseException | None = None
        self.watchers = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    @property
    def every(self) -> float:
        pushed = 0 < self.watchers == self.pushed_watchers
        if pushed and self.backfill_watchers == 0 and asks(self.facts.record.poll_seconds):
            return SLOW_POLL_SECONDS
        return self.facts.record.look_again(backfill=self.backfill_watchers > 0)

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
            record=await record_of(description, self.pace),
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
            await self.refresh()

    async def refresh(self) -> None:
        """Read the group now; wake the watches if anything changed."""
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

    def __init__(self, client: Client, clock: ServerClock | None = None) -> None:
        self._client = client
        # The group's moments are its own clock's (server_clock.py).
        self._clock = clock or ServerClock()
        self._pollers: dict[str, GroupPoller] = {}
        self._intervals: dict[str, float] = {}
        # What each group published with a grant this gateway delivered, by
        # (group, job, the epoch its job was told).
        self._granted: dict[tuple[str, str, int], GroupFacts] = {}

    def granted(self, group: str, grant: Grant, published: PublishedTurn) -> None:
        """The watch of that turn, if it starts here, begins from what the
        group published with the grant instead of reading the group: one
        DescribeWorkflowExecution fewer per turn."""
        if len(self._granted) >= REMEMBERED_GRANTS:
            self._granted.pop(next(iter(self._granted)))
        facts = GroupFacts(holder=grant.job, waiting=published.waiting, record=published.record)
        self._granted[(group, grant.job, grant.told_epoch)] = facts

    async def interval(self, group: str) -> float:
        """How often the group's watches are polled, as its record says (read
        once per group: a policy is fixed when its group is created; one
        Describe, answered by Temporal alone). A group whose run publishes
        no record says it in the memo key its creator set; one created
        before that is asked by a query, a workflow task on the scheduler."""
        every = self._intervals.get(group)
        if every is None:
            handle = self._client.get_workflow_handle_for(
                GroupWorkflow.run, group_workflow_id(group)
            )
            try:
                description = await handle.describe()
                record = await description.memo_value(MEMO_KEY, None, type_hint=WatchRecord)
                every = await description.memo_value(WATCH_POLL_MEMO, None, type_hint=float)
                if record is not None:
                    every = record.poll_seconds
                elif every is None:
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
    async def polling(self, group: str) -> AsyncIterator[tuple[GroupPoller, bool]]:
        """The group's poller, and whether this watch started it."""
        poller = self._pollers.get(group)
        if poller is None:
            every = await self.interval(group)
            poller = self._pollers.get(group) or GroupPoller(self._client, group, every)
            self._pollers[group] = poller
        poller.watchers += 1
        started = poller.start()
        try:
            yield poller, started
        finally:
            poller.watchers -= 1
            if poller.watchers == 0:
                del self._pollers[group]
                await poller.stop()

    @staticmethod
    async def _read(poller: GroupPoller, group: str) -> GroupFacts:
        try:
            return await poller.read()
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                raise GroupNotFound(group) from None
            raise

    async def notices(
        self, group: str, job: str, epoch: int, backfill: bool = False
    ) -> AsyncGenerator[pb.TurnNotice, None]:
        """The watch of one turn: a notice at once, then on every change and at
        least every KEEPALIVE_SECONDS. Raises GroupNotFound for a group that
        does not run."""
        async with self.polling(group) as (poller, started):
            # The first notice is read fresh: a new turn must not be told of
            # the previous one's facts. What the group published with the
            # grant is as fresh. A poller this watch started reads a period
            # later, so this one read serves both.
            facts = self._granted.pop((group, job, epoch), None) or await self._read(poller, group)
            if started:
                poller.seed(facts)
            version = poller.version
            # News pushed where a holder may be asked to yield (turn_push.py).
            push = hears_pushed(facts.record.poll_seconds, backfill)
            async with pushed(self._client, group, job, epoch, poller, facts, backfill, push):
                while True:
                    yield facts.notice(job, epoch, backfill, self._clock.now())
                    # Woken when the group's yield request comes due, to say so then.
                    due = facts.record.asked_from(facts.holder, job, epoch)
                    now = self._clock.now()
                    until_due = due - now if due is not None and due > now else KEEPALIVE_SECONDS
                    await poller.wait_past(version, min(KEEPALIVE_SECONDS, until_due))
                    version, facts = poller.version, poller.facts
                    failed = poller.error
                    if isinstance(failed, RPCError) and failed.status == RPCStatusCode.NOT_FOUND:
                        raise GroupNotFound(group)
