"""The faults of the chaos run: a SIGKILL of one process, chosen by a seeded
random schedule, and its restart (a killed job is replaced)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from bench.parts.chaos_pool import JobPool
from timeshare.testing import LocalStack

KINDS = ("scheduler", "gateway", "agent", "job", "temporal")
# A part stays down this long before it is started again: longer than the
# agent timeout sometimes (the switch fails and is planned again), shorter
# than the lease by far (a live job keeps its place through the outage).
DOWNTIME_SECONDS = (0.0, 8.0)


@dataclass
class Fault:
    kind: str
    target: str
    at: float
    # When the part was ready again (a replacement job starts at once).
    back_at: float
    # What came back, in words.
    outcome: str


def replicas(stack: LocalStack, kind: str) -> list[str]:
    """The parts a fault of ``kind`` may kill: one replica of several, the others serving."""
    if kind == "agent":
        return stack.agents
    if kind == "scheduler":
        return stack.scheduler_parts
    if kind == "gateway":
        return stack.gateway_parts
    return [kind]


def inject(kind: str, stack: LocalStack, pool: JobPool, rng: random.Random) -> Fault:
    if kind == "job":
        victim = rng.choice(pool.running())
        at, replacement = pool.kill_and_replace(victim, rng)
        target = f"job {victim.group}/{victim.job}"
        return Fault(kind, target, at, at, f"replaced by {replacement}")
    # One candidate draws nothing: a run of one replica each keeps its schedule for a seed.
    candidates = replicas(stack, kind)
    part = rng.choice(candidates) if len(candidates) > 1 else candidates[0]
    downtime = rng.uniform(*DOWNTIME_SECONDS)
    # The Temporal dev server restarts on the same SQLite file and port.
    at = time.time()
    stack.restart(part, downtime=downtime)
    back_at = time.time()
    return Fault(
        kind, part, at, back_at, f"down {downtime:.1f} s, ready {back_at - at:.1f} s later"
    )
