"""The faults of the chaos runs: a SIGKILL (or a stop) of one process and
its restart, or a condition of bench.parts.chaos_conditions for a while.

- Random (``python -m bench chaos --minutes N``): the kind and the moment
  drawn by a seeded schedule, the part down for a drawn while; a killed job
  is replaced.
- Scripted (``--scripted``): one fault at a chosen moment (mid-switch, while
  jobs wait, under waiters), each in a stack of its own with four chaos jobs
  (bench.parts.chaos_job) in one group; the jobs stop asking a few seconds
  later and finish the turn they wait for. Measured from the jobs' records
  as the random run's (bench.parts.chaos_check): the time from the fault to
  the next grant, the acquires lost, the errors of live jobs, and the
  overlaps the simulated GPU saw.
"""

from __future__ import annotations

import math
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from bench.parts import chaos_check as check
from bench.parts.chaos_conditions import CONDITIONS, Chaos
from bench.parts.chaos_pool import JobPool, JobSettings
from bench.parts.fault import Fault
from bench.parts.stack import running_stack
from timeshare.models import GroupStatus
from timeshare.testing import LocalStack, overlaps

# A SIGKILL of one part (and its restart), and the conditions of
# bench.parts.chaos_conditions.
KILLS = ("scheduler", "gateway", "agent", "job", "temporal")
KINDS = (*KILLS, *CONDITIONS)
# A part stays down this long before it is started again: longer than the
# agent timeout sometimes (the switch fails and is planned again), shorter
# than the lease by far (a live job keeps its place through the outage).
DOWNTIME_SECONDS = (0.0, 8.0)


def replicas(stack: LocalStack, kind: str) -> list[str]:
    """The parts a fault of ``kind`` may kill: one replica of several, the others serving."""
    if kind == "agent":
        return stack.agents
    if kind == "scheduler":
        return stack.scheduler_parts
    if kind == "gateway":
        return stack.gateway_parts
    return [kind]


def inject(kind: str, chaos: Chaos, rng: random.Random) -> Fault:
    if kind in CONDITIONS:
        return CONDITIONS[kind](chaos, rng)
    stack, pool = chaos.stack, chaos.pool
    if kind == "job":
        victim = rng.choice(pool.running())
        at, replacement = pool.kill_and_replace(victim, rng)
        target = f"job {victim.group}/{victim.job}"
        return Fault(kind, target, at, at, f"replaced by {replacement}")
    # One candidate draws nothing: a run of one replica each keeps its schedule for a seed.
    candidates = replicas(stack, kind)
    part = rng.choice(candidates) if len(candidates) > 1 else candidates[0]
    # The Temporal dev server restarts on the same SQLite file and port.
    return restart(stack, kind, part, downtime=rng.uniform(*DOWNTIME_SECONDS))


def restart(
    stack: LocalStack, kind: str, part: str, signum: int = signal.SIGKILL, downtime: float = 0.0
) -> Fault:
    at = time.time()
    stack.restart(part, signum, downtime)
    back_at = time.time()
    return Fault(
        kind, part, at, back_at, f"down {downtime:.1f} s, ready {back_at - at:.1f} s later"
    )


GROUP = "faults"
JOBS = [f"job-{i}" for i in range(4)]
# How long the jobs keep asking for turns; the fault comes within the first
# seconds, and a job waiting when it ends still gets its turn.
ASKING_SECONDS = 7.0
HOLDER_AND_WAITER = "holder and a waiter killed"


class ScriptedResult(BaseModel):
    fault: str
    seconds_to_next_grant: float
    lost_requests: int
    overlaps: int
    failed_jobs: list[str]


def wait_for_waiters(stack: LocalStack, count: int, timeout: float = 60) -> GroupStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = stack.group(GROUP)
        if status.holder and len(status.queue) >= count:
            return status
        time.sleep(0.02)
    raise RuntimeError(f"never saw {count} waiters")


def restart_when(
    kind: str, waiters: int = 0, signum: int = signal.SIGKILL
) -> Callable[[LocalStack, JobPool], Fault]:
    """Restart the part mid-switch, or once ``waiters`` jobs wait behind the holder."""

    def fault(stack: LocalStack, pool: JobPool) -> Fault:
        if waiters:
            wait_for_waiters(stack, waiters)
        else:
            stack.wait_for(GROUP, "switching")
        return restart(stack, kind, kind, signum)

    return fault


def kill_holder_and_waiter(stack: LocalStack, pool: JobPool) -> Fault:
    status = wait_for_waiters(stack, 1)
    victims = [p for p in pool.running() if p.job in (status.holder, status.queue[0])]
    at = time.time()
    for victim in victims:
        pool.kill(victim)
    return Fault("job", " and ".join(v.job for v in victims), at, at, "not replaced")


SCRIPTED: dict[str, Callable[[LocalStack, JobPool], Fault]] = {
    "scheduler killed mid-switch": restart_when("scheduler"),
    "Temporal restarted while jobs wait": restart_when("temporal", 1, signal.SIGTERM),
    "agent killed mid-checkpoint": restart_when("agent"),
    HOLDER_AND_WAITER: kill_holder_and_waiter,
    "gateway restarted under 3 waiters": restart_when("gateway", 3),
}


def run_scripted(name: str, workdir: Path | None = None) -> ScriptedResult:
    """``workdir``: keep the stack's logs and records there (default: a scratch folder)."""
    # A short lease only where a dead client must lose it: a lease shorter
    # than an outage of the scheduler or of Temporal would evict live jobs
    # whose heartbeats could not get through.
    settings = JobSettings(
        until=0.0, work_seconds=0.3, gap_seconds=0.1,
        lease_seconds=3.0 if name == HOLDER_AND_WAITER else 15.0, agent_timeout_seconds=3.0,
        continue_as_new_every=0,
    )  # fmt: skip
    with running_stack(workdir, state_gib=0.2, bandwidth_gbps=1.0) as stack:
        pool = JobPool(stack, settings)
        try:
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
        stack.stop_all()  # before the counts; the records stay until the with ends
        after = check.recovery_seconds([fault.at], check.grant_times(pool.processes))
        return ScriptedResult(
            fault=name,
            seconds_to_next_grant=after[0] if after else math.nan,
            lost_requests=len(check.lost(pool.processes)),
            overlaps=overlaps(stack.record()),
            failed_jobs=check.errors(pool.processes),
        )
