"""How often a turn watch is polled: a group's regular turns at its policy's
pace (a backfill grace costs groups without backfill jobs nothing), a backfill
job's turn closely, from the watch request the client sends; and what the
group's record (scheduling/watch.py) tells a watch."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.exceptions import ApplicationError

from timeshare import _protocol as protocol
from timeshare.models import GroupPolicy
from timeshare.refusals import Refusal
from timeshare.scheduling import watch
from timeshare.scheduling.watch import WatchRecord
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workers.gateway.turn_push import TurnPush
from timeshare.workers.gateway.turn_watch import GroupFacts, GroupPoller


class NoClient:
    def get_workflow_handle(self, workflow_id: str) -> None:
        return None


def test_a_groups_poll_pace_does_not_follow_the_backfill_grace() -> None:
    assert watch.poll_seconds(GroupPolicy()) == watch.SLOW_POLL_SECONDS
    assert watch.poll_seconds(GroupPolicy(backfill_grace_seconds=1.0)) == (watch.SLOW_POLL_SECONDS)
    assert watch.poll_seconds(GroupPolicy(max_turn_seconds=60)) == watch.POLL_SECONDS


def test_a_backfill_turn_is_polled_closely_while_it_is_watched() -> None:
    poller = GroupPoller(NoClient(), "g", every=5.0)  # type: ignore[arg-type]
    assert poller.every == 5.0
    poller.backfill_watchers += 1
    assert poller.every == watch.BACKFILL_POLL_SECONDS < watch.POLL_SECONDS
    poller.backfill_watchers -= 1
    assert poller.every == 5.0


def test_a_backfill_jobs_watch_request_says_so() -> None:
    for backfill in (True, False):
        join = protocol.join_request("g", "b", None, None, 1.0, 0, backfill)
        job = protocol.job_ref(join, pb.JoinResponse(job_token="t", nodes=["n"]))
        turn = protocol.Turn(epoch=3, ticket=1, waited_seconds=0, switch_seconds=0,
                             granted_at=0, phase="")  # fmt: skip
        assert job.watch_request(turn).backfill is backfill


def test_only_a_regular_holder_hears_that_only_backfill_jobs_wait() -> None:
    def said(holder: str, waiting: int, backfill_waiting: int, backfill: bool = False) -> bool:
        record = WatchRecord(backfill_waiting=backfill_waiting)
        return record.notice(holder, waiting, "a", 3, backfill, 0.0).only_backfill_waiting

    assert said("a", 1, 1)
    assert said("a", 2, 2)
    assert not said("a", 2, 1)  # a regular job waits too: it may go first
    assert not said("a", 0, 0)  # nobody waits: the waiting count says so already
    assert not said("b", 1, 1)  # not holding
    assert not said("a", 1, 1, backfill=True)  # any waiter may go before a backfill job


def test_a_backfill_holder_is_asked_to_yield_when_the_moment_its_group_set_comes() -> None:
    record = WatchRecord(yield_asked=(3, 100.0))
    asked = [record.notice("a", 0, "a", 3, True, now).should_yield for now in (99.9, 100.0)]
    assert asked == [False, True]
    # Another epoch's moment (a turn that ended), or another holder's: not this turn's.
    assert not record.notice("a", 0, "a", 4, True, 100.0).should_yield
    assert not record.notice("a", 0, "b", 3, True, 100.0).should_yield
    assert record.asked_from("a", "a", 3) == 100.0


def test_a_holder_asked_now_hears_it_at_once_and_only_for_its_turn() -> None:
    record = WatchRecord(yield_asked=(3, 0.0))
    assert record.notice("a", 1, "a", 3, False, 0.0).should_yield
    assert not record.notice("a", 1, "a", 2, False, 0.0).should_yield
    assert not WatchRecord().notice("a", 1, "a", 3, False, 0.0).should_yield


def test_a_legacy_runs_memo_keys_tell_what_the_record_tells() -> None:
    def legacy(yield_epoch: int, due: tuple[int, float]) -> WatchRecord:
        return WatchRecord.from_legacy_memo(yield_epoch, 0, due, poll_seconds=5.0)

    for record in (legacy(3, (0, 0.0)), legacy(3, (2, 50.0))):  # asked now; a stale moment
        assert record.notice("a", 1, "a", 3, False, 0.0).should_yield
    assert not legacy(0, (3, 100.0)).notice("a", 0, "a", 3, True, 99.0).should_yield
    assert legacy(0, (3, 100.0)).notice("a", 0, "a", 3, True, 100.0).should_yield


def test_a_record_that_only_drops_an_ended_turns_moment_says_nothing_new() -> None:
    published = WatchRecord(yield_asked=(3, 100.0))
    assert WatchRecord().says_the_same(published, holder_epoch=4)  # epoch 3 ended
    assert not WatchRecord().says_the_same(published, holder_epoch=3)  # taken back
    assert not WatchRecord(backfill_waiting=1).says_the_same(published, holder_epoch=4)
    assert not WatchRecord(yield_asked=(3, 0.0)).says_the_same(published, holder_epoch=3)
    assert not WatchRecord().says_the_same(None, holder_epoch=0)
    assert not WatchRecord().says_the_same(WatchRecord(yield_asked=(3, 0.0)), holder_epoch=4)


def test_a_pushed_watch_waits_only_while_the_group_has_nothing_new_for_that_turn() -> None:
    asked_later = WatchRecord(yield_asked=(3, 1_000.0))
    not_asked = WatchRecord()
    # The gateway read "not asked", nobody waiting: news once the group names
    # a moment, asks now, or someone waits.
    ask = watch.TurnAsk(job="b", epoch=3, waiting=False)
    assert not ask.news(not_asked, "b", 3, 0)
    assert ask.news(asked_later, "b", 3, 0)
    assert ask.news(WatchRecord(yield_asked=(3, 0.0)), "b", 3, 0)
    assert ask.news(not_asked, "b", 3, 1)
    # A watch that polls for who waits (a backfill turn where the policy
    # never asks a regular holder) hears only the ask and the turn's end.
    assert not watch.TurnAsk(job="b", epoch=3).news(not_asked, "b", 3, 1)
    # An ask of another turn is nothing to this one.
    assert not ask.news(WatchRecord(yield_asked=(4, 0.0)), "b", 3, 0)
    # The gateway read the moment and others waiting: news only if either
    # changes, or the turn ends.
    known = watch.TurnAsk(job="b", epoch=3, asked_from=1_000.0, waiting=True)
    assert not known.news(asked_later, "b", 3, 2)
    assert known.news(asked_later, "b", 3, 0)
    assert known.news(WatchRecord(yield_asked=(3, 0.0)), "b", 3, 2)
    assert known.news(asked_later, "b", 4, 2)
    assert known.news(asked_later, "a", 3, 2)
    assert known.news(asked_later, "", 0, 2)


def test_news_is_pushed_where_a_holder_may_be_asked_to_yield() -> None:
    asks = watch.poll_seconds(GroupPolicy(max_turn_seconds=60))
    never = watch.poll_seconds(GroupPolicy())
    assert watch.hears_pushed(asks, backfill=False)
    assert watch.hears_pushed(never, backfill=True)
    assert not watch.hears_pushed(never, backfill=False)
    assert watch.asks(asks) and not watch.asks(never)


def test_a_group_whose_watches_are_all_pushed_is_polled_only_to_keep_them_alive() -> None:
    poller = GroupPoller(NoClient(), "g", every=watch.POLL_SECONDS)  # type: ignore[arg-type]
    poller.seed(GroupFacts(record=WatchRecord(poll_seconds=watch.POLL_SECONDS)))
    poller.watchers = poller.pushed_watchers = 2
    assert poller.every == watch.SLOW_POLL_SECONDS
    poller.pushed_watchers = 1  # one watch polls (its scheduler cannot push)
    assert poller.every == watch.POLL_SECONDS


class RefusingGroup:
    """A group whose watch_turn update fails: first with ``refusals``, then as
    a scheduler from before watch_turn refuses an update it does not know.
    Stands in for temporalio's Client.get_workflow_handle_for and
    WorkflowHandle.execute_update, which raises WorkflowUpdateFailedError
    with the handler's ApplicationError as its cause."""

    def __init__(self, *refusals: str) -> None:
        self.refusals = list(refusals)
        self.asks: list[watch.TurnAsk] = []

    def get_workflow_handle_for(self, run: Any, workflow_id: str) -> RefusingGroup:
        return self

    async def execute_update(self, update: Any, ask: watch.TurnAsk) -> None:
        self.asks.append(ask)
        kind = self.refusals.pop(0) if self.refusals else None
        raise WorkflowUpdateFailedError(ApplicationError("refused", type=kind))


class ReadOnce(GroupPoller):
    def __init__(self) -> None:
        super().__init__(NoClient(), "g", every=0.01)  # type: ignore[arg-type]
        self.reads = 0

    async def read(self) -> GroupFacts:
        self.reads += 1
        return GroupFacts(holder="b", record=WatchRecord(yield_asked=(3, 0.0)))


def test_a_push_the_scheduler_refuses_falls_back_to_the_backfill_pace() -> None:
    group, poller = RefusingGroup(Refusal.FAILED_PRECONDITION), ReadOnce()
    push = TurnPush(group, "g", "b", 3, poller, backfill=True)  # type: ignore[arg-type]
    poller.watchers = 1
    assert poller.every == watch.SLOW_POLL_SECONDS  # pushed: the poll only keeps alive
    asyncio.run(push.run(GroupFacts(holder="b")))
    # Refused for news: the group read, and the wait asked again from what it said.
    assert poller.reads == 1
    assert [ask.asked_from for ask in group.asks] == [None, 0.0]
    # Then refused as unknown: the watch reads at the backfill pace.
    assert push.polling and poller.every == watch.BACKFILL_POLL_SECONDS
    push.end()
    assert (poller.pushed_watchers, poller.backfill_watchers) == (0, 0)


class WaitingGroup(RefusingGroup):
    """A group whose watch_turn waits, as the SDK's call does: its
    cancellation surfaces as WorkflowUpdateRPCTimeoutOrCancelledError."""

    async def execute_update(self, update: Any, ask: watch.TurnAsk) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise WorkflowUpdateRPCTimeoutOrCancelledError() from None


def test_a_push_whose_watch_ends_is_cancelled_not_turned_to_polling() -> None:
    async def scenario() -> TurnPush:
        poller = ReadOnce()
        push = TurnPush(WaitingGroup(), "g", "b", 3, poller, backfill=True)  # type: ignore[arg-type]
        task = asyncio.get_running_loop().create_task(push.run(GroupFacts(holder="b")))
        await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
        return push

    push = asyncio.run(scenario())
    assert not push.polling
