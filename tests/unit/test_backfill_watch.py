"""How often a turn watch is polled: a group's regular turns at its policy's
pace (a backfill grace costs groups without backfill jobs nothing), a backfill
job's turn closely, from the watch request the client sends."""

from __future__ import annotations

from timeshare import _protocol as protocol
from timeshare.models import GroupPolicy
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workers.gateway import turn_watch
from timeshare.workers.gateway.turn_watch import GroupPoller


class NoClient:
    def get_workflow_handle(self, workflow_id: str) -> None:
        return None


def test_a_groups_poll_pace_does_not_follow_the_backfill_grace() -> None:
    assert turn_watch.poll_seconds(GroupPolicy()) == turn_watch.SLOW_POLL_SECONDS
    assert turn_watch.poll_seconds(GroupPolicy(backfill_grace_seconds=1.0)) == (
        turn_watch.SLOW_POLL_SECONDS
    )


def test_a_backfill_turn_is_polled_closely_while_it_is_watched() -> None:
    poller = GroupPoller(NoClient(), "g", every=5.0)  # type: ignore[arg-type]
    assert poller.every == 5.0
    poller.backfill_watchers += 1
    assert poller.every == turn_watch.BACKFILL_POLL_SECONDS < turn_watch.POLL_SECONDS
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
        facts = turn_watch.GroupFacts(holder, waiting, 0, backfill_waiting)
        return turn_watch.notice_of(facts, "a", 3, backfill, 0.0).only_backfill_waiting

    assert said("a", 1, 1)
    assert said("a", 2, 2)
    assert not said("a", 2, 1)  # a regular job waits too: it may go first
    assert not said("a", 0, 0)  # nobody waits: the waiting count says so already
    assert not said("b", 1, 1)  # not holding
    assert not said("a", 1, 1, backfill=True)  # any waiter may go before a backfill job


def test_a_backfill_holder_is_asked_to_yield_when_the_moment_its_group_set_comes() -> None:
    facts = turn_watch.GroupFacts("a", 0, 0, 0, backfill_yield_at=(3, 100.0))
    asked = [turn_watch.notice_of(facts, "a", 3, True, now).should_yield for now in (99.9, 100.0)]
    assert asked == [False, True]
    # Another epoch's moment (a turn that ended), or another holder's: not this turn's.
    assert not turn_watch.notice_of(facts, "a", 4, True, 100.0).should_yield
    assert not turn_watch.notice_of(facts, "b", 3, True, 100.0).should_yield
    assert turn_watch.yield_at(facts, "a", 3) == 100.0
