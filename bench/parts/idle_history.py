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

Each group's history is fetched through the Temporal client at the start and
end of each window; only the events in between count.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

import timeshare.aio
from bench.parts.scale_load import bounded
from timeshare.models import GroupPolicy
from timeshare.names import group_workflow_id

OLD_HEARTBEAT_SECONDS = 10.0
DEFAULT_IDLE_LEASE_SECONDS = GroupPolicy().idle_lease_seconds


@dataclass
class WindowCount:
    """History events of some groups over one window."""

    jobs: int
    seconds: float
    events: Counter[str] = field(default_factory=Counter)
    renewals: int = 0

    @property
    def total(self) -> int:
        return sum(self.events.values())

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

    @property
    def before_per_job_hour(self) -> float:
        return self.before.per_job_hour()


class HistoryMarks:
    """Where each group's history stood, to count what was written since."""

    def __init__(self, client: Client, groups: list[str]) -> None:
        self._client = client
        self.groups = groups
        self._last: dict[str, tuple[str, int]] = {}

    async def _events(self, group: str, run_id: str | None = None) -> list[HistoryEvent]:
        handle = self._client.get_workflow_handle(group_workflow_id(group), run_id=run_id)
        return list((await handle.fetch_history()).events)

    async def mark(self) -> None:
        async def one(group: str) -> None:
            run_id = (
                await self._client.get_workflow_handle(group_workflow_id(group)).describe()
            ).run_id
            events = await self._events(group, run_id)
            self._last[group] = (run_id, events[-1].event_id if events else 0)

        await bounded([partial(one, group) for group in self.groups])

    async def since(self, window: WindowCount) -> None:
        """Add the events written since the last mark to ``window``, and mark again."""

        async def one(group: str) -> list[HistoryEvent]:
            run_id, last = self._last[group]
            return [e for e in await self._events(group, run_id) if e.event_id > last]

        for events in await bounded([partial(one, group) for group in self.groups]):
            for event in events:
                window.events[EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")] += 1
                accepted = event.workflow_execution_update_accepted_event_attributes
                if accepted.accepted_request.input.name == "heartbeat":
                    window.renewals += 1
        await self.mark()


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
        jobs.append(await client.join(group, job, [node], own))
    return jobs


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
        marks, default_marks = HistoryMarks(temporal, short), HistoryMarks(temporal, default)
        await asyncio.gather(marks.mark(), default_marks.mark())
        now = WindowCount(jobs=len(jobs), seconds=seconds)
        default_count = WindowCount(jobs=len(default_jobs), seconds=seconds)
        await asyncio.sleep(seconds)
        await asyncio.gather(marks.since(now), default_marks.since(default_count))
        for job in jobs:
            await job.stop_heartbeats()
        beats = [
            asyncio.ensure_future(_beat(j, rng.uniform(0, OLD_HEARTBEAT_SECONDS))) for j in jobs
        ]
        await marks.mark()
        before = WindowCount(jobs=len(jobs), seconds=seconds)
        await asyncio.sleep(seconds)
        await marks.since(before)
        for beat in beats:
            beat.cancel()
        await asyncio.gather(*beats, return_exceptions=True)
        await bounded([job.leave for job in [*jobs, *default_jobs]])
    return IdleHistory(idle_lease_seconds, now, default_count, before)
