"""Profiles from histories built by hand: the iteration's period found
through noise and outliers, the round trips taken off, the state from the
checkpoints, and an unknown state left unknown."""

from __future__ import annotations

import random

import pytest

from timeshare.history import GroupHistory, SwitchRecord, TurnRecord
from timeshare.models import GroupStatus, JobStatus
from timeshare.placement.profile import profile_group, profile_job
from timeshare.placement.spec import StackCosts

FREE = StackCosts(
    message_seconds=0.0, acquire_seconds=0.0, yield_seconds=0.0,
    plan_seconds=0.0, switch_seconds=0.0, grant_seconds=0.0,
)  # fmt: skip


def noisy_history(seed: int, iterations: int = 12) -> GroupHistory:
    """Job a: sample 0.4 s, reward 0.6 s, train 0.1 s, asking again at once;
    every figure jittered by up to 30 ms, and one reward stalled to 0.9 s."""
    chooser = random.Random(seed)
    turns = []
    now, epoch = 0.0, 0
    for iteration in range(iterations):
        for turn_seconds, gap in ((0.4, 0.6), (0.1, 0.0)):
            epoch += 1
            held = turn_seconds + chooser.uniform(-0.03, 0.03)
            turns.append(TurnRecord(job="a", epoch=epoch, requested_at=now, granted_at=now,
                                    released_at=now + held))  # fmt: skip
            stall = 0.3 if (iteration, gap) == (5, 0.6) else 0.0
            now += held + max(0.0, gap + chooser.uniform(-0.03, 0.03)) + stall
    switches = [
        SwitchRecord(node="n1", epoch=3, started_at=0, finished_at=0.1, evicted=["a"],
                     admitted="b", bytes_moved=5 * 2**30, checkpoint_bytes={"a": 5 * 2**30}),
    ]  # fmt: skip
    return GroupHistory(group="g", captured_at=now, turns=turns, switches=switches)


@pytest.mark.parametrize("seed", range(5))
def test_the_period_is_found_through_noise_and_a_stall(seed: int) -> None:
    found = profile_job("a", ["n1"], noisy_history(seed), FREE)
    kinds = ["gpu" if p.on_gpu else "cpu" for p in found.iteration]
    assert kinds == ["gpu", "cpu", "gpu"]
    assert [p.seconds for p in found.iteration] == pytest.approx([0.4, 0.6, 0.1], abs=0.03)
    assert found.state_gib == 5.0
    assert found.measured is not None
    assert found.measured.iterations == 12
    assert found.measured.state_bytes_by_node == {"n1": 5 * 2**30}


def test_the_stacks_round_trips_are_taken_off() -> None:
    # With 40 ms acquires and yields and 10 ms messages, a 0.5 s turn granted
    # at once is recorded from the grant to the yield's arrival: 0.03 + 0.5
    # + 0.01 s; a 1 s CPU phase is recorded from the yield's arrival to the
    # next acquire's: 0.03 + 1 + 0.01 s.
    costs = FREE.model_copy(
        update={"message_seconds": 0.01, "acquire_seconds": 0.04, "yield_seconds": 0.04}
    )
    turns, now = [], 0.0
    for epoch in range(1, 9):
        turns.append(TurnRecord(job="a", epoch=epoch, requested_at=now, granted_at=now,
                                released_at=now + 0.54))  # fmt: skip
        now += 0.54 + 1.04
    history = GroupHistory(group="g", captured_at=now, turns=turns)
    found = profile_job("a", ["n1"], history, costs)
    assert [p.seconds for p in found.iteration] == pytest.approx([0.5, 1.0])


def test_a_job_never_checkpointed_has_an_unknown_state_and_a_short_one_no_profile() -> None:
    history = noisy_history(0)
    history.switches.clear()
    history.turns.append(TurnRecord(job="b", epoch=99, requested_at=0, granted_at=0,
                                    released_at=1))  # fmt: skip
    status = GroupStatus(group="g", state="idle", jobs=[
        JobStatus(job="a", nodes=["n1"], turns=24, waited_seconds=0, held_seconds=0),
    ])  # fmt: skip
    profiles, skipped = profile_group(status, history, FREE)
    assert [p.name for p in profiles] == ["a"]
    assert profiles[0].state_gib is None
    # b left the group, but its history is still there: too short to profile.
    assert list(skipped) == ["b"] and "1 whole turns" in skipped["b"]
