"""The load of `bench.scale`: many groups of jobs on the asyncio client, each
group handing its turn from one job to the next, either once every
``period`` seconds (as real RL phases do) or as fast as the stack allows.

Paced: turn k of a group starts at its phase + k * period (phases spread at
random over one period, seeded). The job whose turn k is asks half a period
before; the holder yields at the start of turn k, so every hand-over has a
waiter and moves the GPU. The hand-over latency is from the holder's
``yield_()`` to the waiter's ``acquire()`` returning.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import timeshare.aio
from bench.parts.procstat import CpuMeter
from bench.parts.stats import percentile
from timeshare.errors import Aborted, NotFound
from timeshare.models import GroupPolicy

# Joins and leaves in flight at once: enough to fill the stack, few enough
# that none of them times out behind the others.
CONCURRENT_CALLS = 16

T = TypeVar("T")


@dataclass
class GroupLog:
    """Hand-overs in one group, seen from its jobs (all in this process)."""

    group: str
    latencies: list[float] = field(default_factory=list)
    # Jobs told they were evicted (a lease lost), with what they were doing.
    lost: list[str] = field(default_factory=list)


@dataclass
class LoadResult:
    groups: int
    jobs: int
    handovers: int
    seconds: float
    p50_ms: float
    p99_ms: float
    # Evictions the groups counted (leases lost), and what the jobs were told.
    evictions: int
    lost: list[str]
    # CPU seconds of each process of the stack (and this one) over the window.
    cpu: dict[str, float]
    # Paced: over the groups' first grants and last yields, outside the window.
    edge_cpu: dict[str, float] = field(default_factory=dict)
    # The groups, and the window's wall-clock start and end (Unix seconds).
    group_names: list[str] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)

    @property
    def handovers_per_s(self) -> float:
        return self.handovers / self.seconds

    def cpu_ms_per_handover(self, names: Sequence[str]) -> float:
        """CPU of these processes together (the replicas of a part) per hand-over."""
        return sum(self.cpu[name] for name in names) * 1000 / max(1, self.handovers)

    def cpu_ms_per_handover_with_edges(self, names: Sequence[str]) -> float:
        """As measured before the first grants and last yields left the window."""
        edges = sum(self.edge_cpu.get(name, 0.0) for name in names) * 1000
        return self.cpu_ms_per_handover(names) + edges / max(1, self.handovers)

    def cpu_share(self, name: str) -> float:
        """Cores the process kept busy on average."""
        return self.cpu[name] / self.seconds


async def fast_cycle(job: timeshare.aio.Job, log: GroupLog, state: list[str], until: float) -> None:
    """Acquire, yield, again, as fast as the stack allows (the benchmark before
    --period). ``state`` holds the group's last holder, shared by its jobs."""
    yielded_at = 0.0
    while time.monotonic() < until:
        await job.acquire()
        now = time.monotonic()
        if state[0] and state[0] != job.name:
            log.latencies.append((now - yielded_at) * 1000)
        state[0] = job.name
        yielded_at = time.monotonic()
        await job.yield_()


async def _sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.monotonic()))


async def paced_group(
    jobs: list[timeshare.aio.Job], log: GroupLog, phase: float, period: float, until: float
) -> timeshare.aio.Job:
    """The group's hand-overs, one every ``period`` seconds from ``phase``;
    ``jobs[0]`` holds the turn at the start. Returns the job that holds it at
    the end, to give it back after the measured window."""
    holder = jobs[0]
    turn = 1
    while (start := phase + turn * period) <= until:
        waiter = jobs[turn % len(jobs)]
        await _sleep_until(start - period / 2)
        asked = asyncio.get_running_loop().create_task(waiter.acquire())
        await _sleep_until(start)
        yielded_at = time.monotonic()
        await holder.yield_()
        await asked
        log.latencies.append((time.monotonic() - yielded_at) * 1000)
        holder, turn = waiter, turn + 1
    return holder


async def _guarded(log: GroupLog, run: Awaitable[T]) -> T | None:
    """A job evicted (its lease lost) ends its group's run; the run goes on."""
    try:
        return await run
    except (Aborted, NotFound) as error:
        log.lost.append(f"{log.group}: {error}")
        return None


def _guarding(log: GroupLog, call: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T | None]]:
    return lambda: _guarded(log, call())


async def bounded(calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Every call's result, at most CONCURRENT_CALLS of them in flight."""
    gate = asyncio.Semaphore(CONCURRENT_CALLS)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(one(call) for call in calls)))


async def run_load(
    addresses: list[str],
    processes: dict[str, int],
    groups: int,
    jobs_per_group: int,
    node: str,
    period: float,
    seconds: float,
    seed: int = 1,
    name: str = "scale",
    during: Sequence[AbstractContextManager[object]] = (),
) -> LoadResult:
    """``groups`` groups of ``jobs_per_group`` jobs (group g on GPU g of ``node``:
    the agent needs that many), spread over the gateways at
    ``addresses``; ``period`` 0: as fast as possible. ``processes``: the pids
    whose CPU the result reports; ``during``'s are entered for the window (after
    the joins, before the leaves)."""
    clients = [timeshare.aio.connect(address) for address in addresses]
    try:
        names = [f"{name}-{groups}-{g}" for g in range(groups)]

        def joiner(g: int, j: int) -> Callable[[], Awaitable[timeshare.aio.Job]]:
            client = clients[(g * jobs_per_group + j) % len(clients)]
            # Each group has a simulated GPU of its own: a GPU is one group's at a time.
            return lambda: client.join(names[g], f"job-{j}", nodes=[node],
                                       policy=GroupPolicy(gpus=[g]))  # fmt: skip

        joined = await bounded([joiner(g, j) for g in range(groups) for j in range(jobs_per_group)])
        members = [joined[g * jobs_per_group : (g + 1) * jobs_per_group] for g in range(groups)]
        logs = [GroupLog(group) for group in names]
        rng = random.Random(seed)
        # Paced, each group's first grant (which restores its first job's
        # state and hands nothing over) comes before the window and its last
        # yield after it, so that the window's CPU is its hand-overs' alone.
        edges = CpuMeter(processes)
        edge_cpu: dict[str, float] = {}
        if period > 0:
            await bounded([_guarding(log, jobs[0].acquire)
                           for jobs, log in zip(members, logs, strict=True)])  # fmt: skip
            edge_cpu = edges.used()
        with contextlib.ExitStack() as window:
            for context in during:
                window.enter_context(context)
            meter = CpuMeter(processes)
            opened = time.time()
            started = time.monotonic()
            until = started + seconds
            runs: list[Awaitable[timeshare.aio.Job | None]] = []
            for jobs, log in zip(members, logs, strict=True):
                if period > 0:
                    phase = started + rng.uniform(0, period)
                    runs.append(_guarded(log, paced_group(jobs, log, phase, period, until)))
                else:
                    state = [""]
                    runs += [_guarded(log, fast_cycle(job, log, state, until)) for job in jobs]
            holders = await asyncio.gather(*runs)
            elapsed = time.monotonic() - started
            cpu = meter.used()
            closed = time.time()
        if period > 0:
            edges.reset()
            last = [(holder, log) for holder, log in zip(holders, logs, strict=True) if holder]
            await bounded([_guarding(log, holder.yield_) for holder, log in last])
            edge_cpu = {name: edge_cpu[name] + used for name, used in edges.used().items()}
        statuses = await bounded([partial(clients[0].get_group, group) for group in names])
        evictions = sum(status.evictions for status in statuses)
        await bounded([job.leave for job in joined])
    finally:
        for client in clients:
            await client.close()
    latencies = [ms for log in logs for ms in log.latencies]
    return LoadResult(
        groups=groups,
        jobs=groups * jobs_per_group,
        handovers=len(latencies),
        seconds=elapsed,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        evictions=evictions,
        lost=[lost for log in logs for lost in log.lost],
        cpu=cpu,
        edge_cpu=edge_cpu,
        group_names=names,
        window=(opened, closed),
    )
