"""What turn watches cost with nothing else going on: one job per group holds
its turn, its watch open (its gateway polls the group's published facts,
workers/gateway/turn_watch.py); then no turn is held; then a backfill job per
group holds, its watch polled closely. Each process's CPU over each window."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial

import timeshare.aio
from bench.parts.procstat import CpuMeter
from bench.parts.scale_load import bounded
from timeshare.models import GroupPolicy

SETTLE_SECONDS = 2.0


@dataclass
class WatchCost:
    groups: int
    # Cores each process kept busy: every group's holder watched; none; backfill holders.
    watched: dict[str, float]
    unwatched: dict[str, float]
    backfill: dict[str, float]


async def _cores(processes: dict[str, int], seconds: float) -> dict[str, float]:
    await asyncio.sleep(SETTLE_SECONDS)
    meter = CpuMeter(processes)
    await asyncio.sleep(seconds)
    return {name: used / seconds for name, used in meter.used().items()}


async def measure_watch_cost(
    address: str, node: str, processes: dict[str, int], groups: int, seconds: float
) -> WatchCost:
    async with timeshare.aio.connect(address) as client:
        cores = []
        for backfill in (False, True):
            jobs = await bounded([partial(client.join, f"watch-{g}", f"holder{backfill:d}", [node],
                                          GroupPolicy(gpus=[g]), backfill=backfill)
                                  for g in range(groups)])  # fmt: skip
            await bounded([job.acquire for job in jobs])
            cores.append(await _cores(processes, seconds))
            await bounded([job.leave for job in jobs])
            cores += [] if backfill else [await _cores(processes, seconds)]
    return WatchCost(groups, *cores)
