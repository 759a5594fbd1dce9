"""The faults of the chaos run: a SIGKILL of one process, chosen by a seeded
random schedule, and its restart (a killed job is replaced)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from bench.chaos_pool import JobPool
from bench.faults import restart
from bench.stack import LocalStack

KINDS = ("scheduler", "gateway", "agent", "job", "temporal")


@dataclass
class Fault:
    kind: str
    target: str
    at: float
    # What came back: "ready again in N s", or the replacement job.
    outcome: str


def inject(kind: str, stack: LocalStack, pool: JobPool, rng: random.Random) -> Fault:
    if kind == "job":
        victim = rng.choice(pool.running())
        at, replacement = pool.kill_and_replace(victim, rng)
        return Fault(kind, f"job {victim.group}/{victim.job}", at, f"replaced by {replacement}")
    part = rng.choice(stack.agents) if kind == "agent" else kind
    # The Temporal dev server restarts on the same SQLite file and port.
    _, at = restart(stack, part)
    return Fault(kind, part, at, f"ready again in {time.time() - at:.1f} s")
