"""What turn watches cost with nothing else going on: one job per group holds
its turn, its watch open; then no turn is held; then a backfill job per
group holds, its watch open too; then a regular job per group holds in
groups whose policy can ask it to yield (a turn limit), its news pushed.
Each process's CPU over each window.

Then how soon a holder hears that it should yield: in each group a regular
job asks while the backfill job holds, so the group asks the holder to yield
in the workflow task that takes the request. From that task's start (the
group's history) to the moment the holder's client sets yield_requested,
both on this machine's clock: one workflow task and one round trip at best."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from functools import partial

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

import timeshare.aio
from bench.parts.procstat import CpuMeter
from bench.parts.scale_load import bounded
from timeshare.models import GroupPolicy
from timeshare.names import group_workflow_id

SETTLE_SECONDS = 2.0
# The regular jobs ask this far apart, so that each ask is measured alone.
ASK_SPACING_SECONDS = 0.05
HEAR_TIMEOUT_SECONDS = 30.0
# The asking groups' turn limit: never reached in the window.
TURN_LIMIT_SECONDS = 3600.0


@dataclass
class WatchCost:
    groups: int
    # Cores each process kept busy: every group's holder watched; none; backfill holders.
    watched: dict[str, float]
    unwatched: dict[str, float]
    backfill: dict[str, float]
    # Milliseconds from the start of the workflow task that asked a backfill
    # holder to yield to its client hearing it, one per group.
    should_yield_ms: list[float] = field(default_factory=list)
    # Regular holders watched in groups that can ask them to yield.
    asking: dict[str, float] = field(default_factory=dict)


async def _cores(processes: dict[str, int], seconds: float) -> dict[str, float]:
    await asyncio.sleep(SETTLE_SECONDS)
    meter = CpuMeter(processes)
    await asyncio.sleep(seconds)
    return {name: used / seconds for name, used in meter.used().items()}


async def _deciding_task_started(temporal: Client, group: str) -> float:
    """When the workflow task that took the group's last acquire started."""
    started = deciding = 0.0
    handle = temporal.get_workflow_handle(group_workflow_id(group))
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = event.event_time.ToMicroseconds() / 1e6
        accepted = event.workflow_execution_update_accepted_event_attributes
        if event.HasField("workflow_execution_update_accepted_event_attributes") and (
            accepted.accepted_request.input.name == "acquire"
        ):
            deciding = started
    return deciding


async def _hear(holder: timeshare.aio.Job, asker: timeshare.aio.Job, delay: float) -> float:
    """The regular job asks after ``delay``; when the holder heard it should yield."""
    await asyncio.sleep(delay)
    asked = asyncio.get_running_loop().create_task(asker.acquire())
    await asyncio.wait_for(holder.yield_requested.wait(), HEAR_TIMEOUT_SECONDS)
    heard = time.time()
    await holder.yield_()
    await asked
    await asker.yield_()
    return heard


async def should_yield_latencies(
    temporal: Client, groups: list[str], holders: list[timeshare.aio.Job],
    askers: list[timeshare.aio.Job],
) -> list[float]:  # fmt: skip
    pairs = enumerate(zip(holders, askers, strict=True))
    heard = await asyncio.gather(*(_hear(h, a, n * ASK_SPACING_SECONDS) for n, (h, a) in pairs))
    decided = await bounded([partial(_deciding_task_started, temporal, g) for g in groups])
    return [(h - d) * 1000 for h, d in zip(heard, decided, strict=True)]


async def measure_watch_cost(
    temporal: Client, address: str, node: str, processes: dict[str, int], groups: int,
    seconds: float,
) -> WatchCost:  # fmt: skip
    names = [f"watch-{g}" for g in range(groups)]
    async with timeshare.aio.connect(address) as client:
        cores = []
        for backfill in (False, True):
            jobs = await bounded([partial(client.join, names[g], f"holder{backfill:d}",
                                          nodes=[node], policy=GroupPolicy(gpus=[g]),
                                          backfill=backfill) for g in range(groups)])  # fmt: skip
            await bounded([job.acquire for job in jobs])
            if not backfill:
                cores.append(await _cores(processes, seconds))
                await bounded([job.leave for job in jobs])
                cores.append(await _cores(processes, seconds))
                continue
            askers = await bounded([partial(client.join, name, "regular", nodes=[node])
                                    for name in names])  # fmt: skip
            cores.append(await _cores(processes, seconds))
            latencies = await should_yield_latencies(temporal, names, jobs, askers)
            await bounded([job.leave for job in [*jobs, *askers]])
        # A group's policy is fixed when it is made: groups of their own.
        holders = await bounded([
            partial(client.join, f"watch-asking-{g}", "holder", nodes=[node],
                    policy=GroupPolicy(gpus=[g], max_turn_seconds=TURN_LIMIT_SECONDS))
            for g in range(groups)
        ])  # fmt: skip
        await bounded([job.acquire for job in holders])
        # New groups: their first tasks, switches and watches settle first.
        await asyncio.sleep(SETTLE_SECONDS)
        asking = await _cores(processes, seconds)
        await bounded([job.leave for job in holders])
    watched, unwatched, backfill_held = cores
    return WatchCost(groups, watched, unwatched, backfill_held, latencies, asking)
