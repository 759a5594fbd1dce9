"""The scripted faults of ``python -m bench chaos --scripted``: one fault at a
chosen moment (mid-switch, while jobs wait, under waiters), each in a stack
of its own with four chaos jobs (bench.parts.chaos_job) in one group; the
jobs stop asking a few seconds later and finish the turn they wait for.
Measured from the jobs' records as the random run's (bench.parts.chaos_check):
the time from the fault to the next grant, the acquires lost, the errors of
live jobs, and the overlaps the simulated GPU saw."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from bench.parts import chaos_check as check
from bench.parts.chaos_faults import Fault
from bench.parts.chaos_pool import JobPool, JobSettings
from timeshare.models import GroupStatus
from timeshare.testing import LocalStack, overlaps

GROUP = "faults"
JOBS = [f"job-{i}" for i in range(4)]
# How long the jobs keep asking for turns; the fault comes within the first
# seconds, and a job waiting when it ends still gets its turn.
ASKING_SECONDS = 10.0
HOLDER_AND_WAITER = "holder and a waiter killed"


class ScriptedResult(BaseModel):
    fault: str
    seconds_to_next_grant: float
    lost_requests: int
    overlaps: int
    failed_jobs: list[str]


def restart(stack: LocalStack, part: str, signum: int = signal.SIGKILL) -> Fault:
    at = time.time()
    stack.restart(part, signum)
    return Fault(part, part, at, time.time(), "restarted")


def wait_for_waiters(stack: LocalStack, count: int, timeout: float = 60) -> GroupStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = stack.group(GROUP)
        if status.holder and len(status.queue) >= count:
            return status
        time.sleep(0.02)
    raise RuntimeError(f"never saw {count} waiters")


def kill_scheduler_mid_switch(stack: LocalStack, pool: JobPool) -> Fault:
    stack.wait_for(GROUP, "switching")
    return restart(stack, "scheduler")


def restart_temporal_while_jobs_wait(stack: LocalStack, pool: JobPool) -> Fault:
    wait_for_waiters(stack, 1)
    return restart(stack, "temporal", signal.SIGTERM)


def kill_agent_mid_checkpoint(stack: LocalStack, pool: JobPool) -> Fault:
    stack.wait_for(GROUP, "switching")
    return restart(stack, "agent")


def kill_holder_and_waiter(stack: LocalStack, pool: JobPool) -> Fault:
    status = wait_for_waiters(stack, 1)
    victims = [p for p in pool.running() if p.job in (status.holder, status.queue[0])]
    at = time.time()
    for victim in victims:
        pool.kill(victim)
    return Fault("job", " and ".join(v.job for v in victims), at, at, "not replaced")


def restart_gateway_under_waiters(stack: LocalStack, pool: JobPool) -> Fault:
    wait_for_waiters(stack, 3)
    return restart(stack, "gateway")


SCRIPTED: dict[str, Callable[[LocalStack, JobPool], Fault]] = {
    "scheduler killed mid-switch": kill_scheduler_mid_switch,
    "Temporal restarted while jobs wait": restart_temporal_while_jobs_wait,
    "agent killed mid-checkpoint": kill_agent_mid_checkpoint,
    HOLDER_AND_WAITER: kill_holder_and_waiter,
    "gateway restarted under 3 waiters": restart_gateway_under_waiters,
}


def run_scripted(name: str, workdir: Path) -> ScriptedResult:
    stack = LocalStack(workdir, state_gib=0.2, bandwidth_gbps=1.0)
    # A short lease only where a dead client must lose it: a lease shorter
    # than an outage of the scheduler or of Temporal would evict live jobs
    # whose heartbeats could not get through.
    settings = JobSettings(
        until=0.0, work_seconds=0.3, gap_seconds=0.1,
        lease_seconds=3.0 if name == HOLDER_AND_WAITER else 15.0, agent_timeout_seconds=3.0,
        continue_as_new_every=0,
    )  # fmt: skip
    pool = JobPool(stack, settings)
    try:
        stack.start_all()
        settings.until = time.time() + ASKING_SECONDS
        for job in JOBS:
            pool.start(GROUP, job, [stack.node], [])
        stack.wait_for(GROUP, "held")
        fault = SCRIPTED[name](stack, pool)
        deadline = time.monotonic() + 300
        while pool.running() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        pool.stop()
        stack.stop_all()
    after = check.recovery_seconds([fault.at], check.grant_times(pool.processes))
    return ScriptedResult(
        fault=name,
        seconds_to_next_grant=after[0] if after else math.nan,
        lost_requests=len(check.lost(pool.processes)),
        overlaps=overlaps(stack.record()),
        failed_jobs=check.errors(pool.processes),
    )
