"""What idle jobs cost their groups' histories, counted from Temporal itself.

Jobs join and then do nothing. Two windows on the same jobs:

- now: the client renews each lease only when it must (every third of
  ``idle_lease_seconds``). With the default policy that is every 1200 s, which
  no short window sees, so the jobs' groups take a short idle lease (30 s:
  a renewal every 10 s) and the count is scaled to the default's renewal rate.
  Scaling is exact to first order: an idle group writes history only for a
  renewal or for the timer of its earliest lease deadline, and both come as
  often as the idle lease is short. Groups with the default policy are
  counted beside them, unscaled.
- before (the heartbeat every 10 s of clients before the turn watch): the
  jobs' own renewals are stopped and the benchmark sends each job's
  Heartbeat RPC every 10 s, at a phase of its own.

Each group's history is fetched through the Temporal client after each
window; only the events written within it count.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from temporalio.client import Client

import timeshare.aio
from bench.parts.scale_load import bounded
from bench.parts.window_history import count_events, event_name
from timeshare.models import GroupPolicy

OLD_HEARTBEAT_SECONDS = 10.0
DEFAULT_IDLE_LEASE_SECONDS = GroupPolicy().idle_lease_seconds
# A renewal, as bench.parts.window_history.event_name names its accepted update.
RENEWAL = "WORKFLOW_EXECUTION_UPDATE_ACCEPTED (heartbeat)"


@dataclass
class WindowCount:
    """History events of some groups over one window."""

    jobs: int
    seconds: float
    events: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.events.values())

    @property
    def renewals(self) -> int:
        return self.events[RENEWAL]

    def per_job_hour(self, scale: float = 1.0) -> float:
        return self.total / self.jobs / (self.seconds / 3600) * scale


@dataclass
class IdleHistory:
    idle_lease_seconds: float
    now: WindowCount
    default_policy: WindowCount
    before: WindowCount

    @property
    def scale(self) -> float:
        """From the short idle lease's renewal rate to the default policy's."""
        return self.idle_lease_seconds / DEFAULT_IDLE_LEASE_SECONDS

    @property
    def now_per_job_hour(self) -> float:
        return self.now.per_job_hour(self.scale)


async def _join_spread(
    client: timeshare.aio.Client,
    names: list[tuple[str, str]],
    policy: GroupPolicy,
    node: str,
    over: float,
    rng: random.Random,
    first_gpu: int = 0,
) -> list[timeshare.aio.Job]:
    """Join at random moments over ``over`` seconds, so that renewals, each a
    third of the idle lease after the job's last message, are spread as a
    real cluster's would be."""
    started = time.monotonic()
    offsets = sorted((rng.uniform(0, over), group, job) for group, job in names)
    # Each group claims a GPU of its own (a GPU is one group's at a time).
    gpus = {group: first_gpu + n for n, group in enumerate(dict.fromkeys(g for g, _ in names))}
    jobs = []
    for offset, group, job in offsets:
        await asyncio.sleep(max(0.0, started + offset - time.monotonic()))
        own = policy.model_copy(update={"gpus": [gpus[group]]})
        jobs.append(await client.join(group, job, nodes=[node], policy=own))
    return jobs


async def _window(seconds: float) -> tuple[float, float]:
    """Wait ``seconds``; the window's start and end (Unix seconds)."""
    opened = time.time()
    await asyncio.sleep(seconds)
    return opened, time.time()


async def _count(
    temporal: Client, groups: list[str], jobs: int, window: tuple[float, float]
) -> WindowCount:
    events = await count_events(temporal, groups, event_name, window)
    return WindowCount(jobs=jobs, seconds=window[1] - window[0], events=events)


async def _beat(job: timeshare.aio.Job, first: float) -> None:
    await asyncio.sleep(first)
    while True:
        await job.heartbeat()
        await asyncio.sleep(OLD_HEARTBEAT_SECONDS)


async def measure_idle_history(
    temporal: Client,
    address: str,
    node: str,
    groups: int,
    jobs_per_group: int,
    seconds: float,
    idle_lease_seconds: float = 30.0,
    seed: int = 1,
) -> IdleHistory:
    rng = random.Random(seed)
    short = [f"idle-{g}" for g in range(groups)]
    default = [f"idle-default-{g}" for g in range(groups)]
    members = [(group, f"job-{j}") for group in short for j in range(jobs_per_group)]
    default_members = [(group, f"job-{j}") for group in default for j in range(jobs_per_group)]
    async with timeshare.aio.connect(address) as client:
        renewal = idle_lease_seconds / 3
        # An idle lease is at least the lease (30 s unless shorter still).
        short_lease = GroupPolicy(
            lease_seconds=min(30.0, idle_lease_seconds), idle_lease_seconds=idle_lease_seconds
        )
        jobs, default_jobs = await asyncio.gather(
            _join_spread(client, members, short_lease, node, renewal, rng),
            _join_spread(client, default_members, GroupPolicy(), node, renewal, rng, groups),
        )
        # The joins' own workflow tasks are done before the windows open.
        await asyncio.sleep(2.0)
        window = await _window(seconds)
        now, default_count = await asyncio.gather(
            _count(temporal, short, len(jobs), window),
            _count(temporal, default, len(default_jobs), window),
        )
        for job in jobs:
            await job.stop_heartbeats()
        beats = [
            asyncio.ensure_future(_beat(j, rng.uniform(0, OLD_HEARTBEAT_SECONDS))) for j in jobs
        ]
        before = await _count(temporal, short, len(jobs), await _window(seconds))
        for beat in beats:
            beat.cancel()
        await asyncio.gather(*beats, return_exceptions=True)
        await bounded([job.leave for job in [*jobs, *default_jobs]])
    return IdleHistory(idle_lease_seconds, now, default_count, before)
