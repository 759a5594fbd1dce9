"""Fair share between two busy jobs: the turn is held open for a
yielder behind its share, for about as long as it takes to ask again, so
that the job with short turns is not handed over after every one of them.
The pure queue, driven as the workflow drives it, in simulated time."""

from __future__ import annotations

import heapq
import itertools

import pytest

from tests.lock_queue import LockQueue
from timeshare.models import GroupPolicy
from timeshare.scheduling.rules import RULES_ANTICIPATION, RULES_POLICIES
from timeshare.scheduling.state import GroupState, StoredPolicy

# How long a job takes, after its yield, to ask for its next turn: a client's
# round trip (the workflow's own clock sees a few milliseconds).
ASK_GAP = 0.004
SECONDS = 15.0


def group(rules: int, policy: GroupPolicy | None = None, **weights: float) -> LockQueue:
    state = GroupState(group="g", policy=StoredPolicy.stored(policy or GroupPolicy()), rules=rules)
    queue = LockQueue(state)
    for job, weight in weights.items():
        queue.join(job, ["n"], f"h-{job}", now=0.0, weight=weight)
    return queue


def busy(
    queue: LockQueue,
    holds: dict[str, float],
    gaps: dict[str, float] | None = None,
    seconds: float = SECONDS,
) -> tuple[dict[str, float], int, float]:
    """Each job asks, holds its turn for its hold, yields, and asks again its
    gap later, for ``seconds``; switches take no time. GPU-seconds per job,
    hand-overs, and the seconds the GPU sat idle with a job waiting."""
    gaps = gaps or dict.fromkeys(holds, ASK_GAP)
    asks = [(0.0, job) for job in sorted(holds)]
    heapq.heapify(asks)
    handovers, idle, requests, last_holder, last_epoch = 0, 0.0, 0, "", 0
    now = released_at = 0.0
    others_waited = False
    while now < seconds:
        turn = queue.state.turn
        release = turn.granted_at + holds[turn.job] if turn is not None else float("inf")
        held = queue.state.anticipation
        wake = held.until if held is not None else float("inf")
        ask = asks[0][0] if asks else float("inf")
        now = min(release, wake, ask)
        if turn is not None and now == release:
            others_waited = any(w.job != turn.job for w in queue.state.queue)
            queue.yield_turn(turn.job, turn.epoch, now)
            heapq.heappush(asks, (now + gaps[turn.job], turn.job))
            released_at = now
        elif now == ask:
            _, job = heapq.heappop(asks)
            requests += 1
            queue.request(job, f"{job}-{requests}", now)
        else:
            queue.expire(now)
        if queue.needs_switch():
            queue.begin_switch(now)
            queue.finish_switch(now)
        granted = queue.state.turn
        if granted is not None and granted.epoch != last_epoch:
            if others_waited:  # the GPU sat idle while someone waited
                idle += now - released_at
            handovers += granted.job != last_holder
            last_holder, last_epoch = granted.job, granted.epoch
    return {j: e.held_seconds for j, e in queue.state.jobs.items()}, handovers, idle


def test_two_busy_jobs_get_gpu_time_within_a_third_of_each_other() -> None:
    holds = {"long": 0.4, "short": 0.07}
    used, _, _ = busy(group(RULES_ANTICIPATION, long=1, short=1), holds)
    assert max(used.values()) / min(used.values()) <= 1.3, used
    # Groups from before anticipation alternate, as FIFO would.
    before, _, _ = busy(group(RULES_POLICIES, long=1, short=1), holds)
    assert before["long"] / before["short"] == pytest.approx(0.4 / 0.07, rel=0.05)


def test_weights_scale_the_two_jobs_shares() -> None:
    used, _, _ = busy(group(RULES_ANTICIPATION, long=1, short=2), {"long": 0.4, "short": 0.07})
    assert used["short"] / used["long"] == pytest.approx(2.0, rel=0.3), used


def test_equal_jobs_still_alternate_every_turn() -> None:
    holds = {"a": 0.1, "b": 0.1}
    queue = group(RULES_ANTICIPATION, a=1, b=1)
    _, handovers, _ = busy(queue, holds)
    assert handovers == queue.state.grants


def test_a_higher_priority_waiter_is_never_held_back() -> None:
    queue = group(RULES_ANTICIPATION)
    queue.join("long", ["n"], "h-long", now=0.0, priority=5)
    queue.join("short", ["n"], "h-short", now=0.0)
    used, _, _ = busy(queue, {"long": 0.4, "short": 0.07})
    # long goes first whenever it waits: it waits only through short's turns.
    assert used["long"] / used["short"] == pytest.approx(0.4 / 0.07, rel=0.05)


def test_a_yielder_slower_than_the_cap_is_not_waited_for() -> None:
    holds, cap = {"long": 0.4, "short": 0.07}, GroupPolicy().fair_anticipation_seconds
    queue = group(RULES_ANTICIPATION, long=1, short=1)
    used, _, idle = busy(queue, holds, gaps={"long": ASK_GAP, "short": 2 * cap})
    assert queue.state.anticipation is None or queue.state.anticipation.job == "short"
    # It asks too late to be held for: never held, so never any idle GPU.
    assert idle == 0.0
    assert used["long"] / used["short"] == pytest.approx(0.4 / 0.07, rel=0.1)


def test_a_hold_the_yielder_does_not_use_costs_at_most_its_window() -> None:
    queue = group(RULES_ANTICIPATION, long=1, short=1)

    def switch_if_due(now: float) -> None:
        if queue.needs_switch():
            queue.begin_switch(now)
            queue.finish_switch(now)

    queue.request("long", "long-0", 0.0)
    switch_if_due(0.0)
    queue.request("short", "short-0", 0.001)
    for epoch, (job, yields, other) in enumerate(
        [("long", 0.4, "short"), ("short", 0.47, "long"), ("long", 0.87, "short")], start=1
    ):
        # short's gap is unknown at its first yield: long goes, as it would.
        queue.yield_turn(job, epoch, yields)
        switch_if_due(yields)
        turn = queue.state.turn
        assert turn is not None and turn.job == other
        queue.request(job, f"{job}-{epoch}", yields + ASK_GAP)
    # short, behind its share and known to ask again within 4 ms, yields...
    queue.yield_turn("short", 4, 0.94)
    held = queue.state.anticipation
    assert held is not None and held.job == "short"
    assert 0 < held.until - 0.94 <= GroupPolicy().fair_anticipation_seconds
    assert queue.state.turn is None and not queue.needs_switch()
    assert queue.next_deadline(0.94) == held.until
    # ... and does not ask: long is granted when the hold ends, no later.
    queue.expire(held.until)
    switch_if_due(held.until)
    turn = queue.state.turn
    assert turn is not None and turn.job == "long" and turn.granted_at == held.until
    assert queue.state.anticipation is None


def test_a_yielder_that_asks_within_its_hold_keeps_the_gpu() -> None:
    queue = group(RULES_ANTICIPATION, long=1, short=1)
    busy(queue, {"long": 0.4, "short": 0.07}, seconds=2.0)
    turns = [t.job for t in queue.state.recent_turns]
    # short took turns back to back, with long waiting, at least once.
    assert any(a == b == "short" for a, b in itertools.pairwise(turns)), turns
