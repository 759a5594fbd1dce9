"""What turn watches cost with nothing else going on: one job per group holds
its turn, so every group has a watch open and its gateway polls the group's
published facts (workers/gateway/turn_watch.py); then the jobs yield, so no watch is
open. The CPU of each process over each window is the difference."""

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
    # Cores each process kept busy: with every group's holder watching, and with none.
    watched: dict[str, float]
    unwatched: dict[str, float]


async def _cores(processes: dict[str, int], seconds: float) -> dict[str, float]:
    await asyncio.sleep(SETTLE_SECONDS)
    meter = CpuMeter(processes)
    await asyncio.sleep(seconds)
    return {name: used / seconds for name, used in meter.used().items()}


async def measure_watch_cost(
    address: str, node: str, processes: dict[str, int], groups: int, seconds: float
) -> WatchCost:
    async with timeshare.aio.connect(address) as client:
        jobs = await bounded(
            [
                partial(client.join, f"watch-{g}", "holder", [node], GroupPolicy(gpus=[g]))
                for g in range(groups)
            ]
        )
        await bounded([job.acquire for job in jobs])
        watched = await _cores(processes, seconds)
        await bounded([job.yield_ for job in jobs])
        unwatched = await _cores(processes, seconds)
        await bounded([job.leave for job in jobs])
    return WatchCost(groups, watched, unwatched)
