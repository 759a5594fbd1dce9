"""Two real TRL GRPO jobs (a tiny Llama and a tokenizer made in code, nothing
from a hub) take turns in one group on a real stack whose agent runs the
freeze backend. Each job's final weights are bit-identical to the same seed
trained alone, and the agent's freeze record shows that whenever one job held
a turn, the other job's trainer process was stopped."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from examples.trl_grpo.compare import Comparison, compare
from timeshare.integrations.turns import TurnRecord

pytest.importorskip("trl")
STEPS = 3


def stopped_intervals(record: list[dict[str, Any]], job: str) -> list[tuple[float, float]]:
    """When the agent had ``job``'s processes stopped: from each freeze's end
    to the next thaw's start (or for ever, if none came)."""
    events = sorted((e for e in record if e["job"] == job), key=lambda e: e["start"])
    intervals = []
    for event, following in itertools.zip_longest(events, events[1:]):
        if event["event"] == "freeze":
            thawed = following["start"] if following is not None else float("inf")
            intervals.append((event["end"], thawed))
    return intervals


def check_never_at_once(result: Comparison) -> None:
    turns = {job: run.turns for job, run in result.shared.items()}
    for job, other in itertools.permutations(turns, 2):
        stopped = stopped_intervals(result.record, other)
        assert stopped, f"{other} was never stopped: the jobs did not take turns"
        # The other job's trainer process is registered from its first turn on,
        # and has exited by the end of its last (the coordinator's last yield).
        registered_at, exited_at = turns[other][0].granted_at, turns[other][-1].yielded_at
        for turn in turns[job]:
            if not registered_at < turn.granted_at < exited_at:
                continue
            assert any(start <= turn.granted_at and turn.yielded_at <= end
                       for start, end in stopped), (
                f"{job}'s {turn.phase} turn {turn} ran while {other} was not stopped: {stopped}"
            )  # fmt: skip
    for a, b in itertools.product(turns["job-a"], turns["job-b"]):
        assert not overlap(a, b), f"turns held at once: {a} and {b}"


def overlap(a: TurnRecord, b: TurnRecord) -> bool:
    return a.granted_at < b.yielded_at and b.granted_at < a.yielded_at


def test_two_trl_grpo_jobs_take_turns_and_train_as_alone(tmp_path: Path) -> None:
    result = compare(STEPS, tmp_path)
    shared, other = result.shared["job-a"].result, result.shared["job-b"].result
    assert len(shared.reward_curve) == STEPS
    assert shared.reward_curve == result.alone.reward_curve
    assert shared.fingerprint == result.alone.fingerprint
    assert other.fingerprint != shared.fingerprint  # another seed: really another job
    # A setup turn, then a rollout and a train turn per step.
    phases = [turn.phase for turn in result.shared["job-a"].turns]
    assert phases == ["setup", *["rollout", "train"] * STEPS]
    frozen = {pid for e in result.record if e["event"] == "freeze" for pid in e["pids"]}
    assert {shared.pid, other.pid} <= frozen
    check_never_at_once(result)
