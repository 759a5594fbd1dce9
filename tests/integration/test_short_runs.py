"""Short runs of three jobs taking turns in new groups, as `python -m bench
short_runs` makes hundreds of them: the first right after a fresh `timeshare
up` has said it is ready. Every turn happens, and a job that fails is
reported with its cause, never lost unheard."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bench.short_runs import JobOutcome, run_group, take_turns
from timeshare.testing import LocalStack
from timeshare.testing.up_stack import fresh_up
from timeshare.workers.gateway.errors import MESSAGE_SECONDS

JOBS, TURNS = 3, 10


def test_runs_right_after_a_fresh_up_lose_no_turn() -> None:
    with fresh_up(("--sim-state-gib=0",)) as stack:
        outcomes = [
            run_group(stack.address, run, f"short-{run}", JOBS, TURNS, 0.02, after_ready=run == 0)
            for run in range(3)
        ]
    for outcome in outcomes:
        assert outcome.errors() == [], outcome
        assert [job.turns for job in outcome.jobs] == [TURNS] * JOBS, outcome


def test_a_job_that_cannot_join_is_reported_with_its_cause() -> None:
    outcome = run_group("127.0.0.1:1", 0, "nowhere", JOBS, TURNS, 0.02)
    assert outcome.turns() == 0
    assert len(outcome.errors()) == JOBS
    for job in outcome.jobs:
        assert "Unavailable: UNAVAILABLE: no timeshare gateway answers at 127.0.0.1:1" in job.error


def test_a_job_joining_while_the_scheduler_is_down_gets_its_turns_once_it_is_back(
    tmp_path: Path,
) -> None:
    with LocalStack(tmp_path, state_gib=0.0) as stack:
        stack.kill("scheduler")
        outcome: list[JobOutcome] = []
        job = threading.Thread(
            target=lambda: outcome.append(take_turns(stack.address, "late", "job-0", 2, 0.02))
        )
        job.start()
        # Long enough for the gateway to give up on the scheduler once and
        # answer UNAVAILABLE: the job sends its Join again.
        time.sleep(MESSAGE_SECONDS + 3)
        stack.start("scheduler")
        job.join(120)
    assert outcome == [JobOutcome(job="job-0", turns=2)]
