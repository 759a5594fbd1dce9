"""Scale: many groups on one scheduler worker, one gateway and the embedded
dev server, each group's jobs cycling through zero-byte switches as fast as
they can (sim backend, one node).

    python -m bench.scale            # 1, 10, 50 and 200 groups, 20 s each
    python -m bench.scale --quick    # 1, 10 and 50 groups, 8 s each
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

import timeshare.aio
from bench.stack import LocalStack
from bench.stats import percentile
from timeshare.models import GroupPolicy
from timeshare.status import table

JOBS_PER_GROUP = (2, 3, 4)


class ScaleResult(BaseModel):
    groups: int
    jobs: int
    grants: int
    handoffs: int
    seconds: float
    p99_ms: float
    worker_cpu_ms_per_handoff: float

    @property
    def handoffs_per_s(self) -> float:
        return self.handoffs / self.seconds


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class GroupLog:
    """Hand-overs in one group, seen from its jobs (all in this process)."""

    def __init__(self) -> None:
        self.last_holder = ""
        self.yielded_at = 0.0
        self.latencies: list[float] = []
        self.grants = 0


async def cycle(job: timeshare.aio.Job, log: GroupLog, until: float) -> None:
    while time.monotonic() < until:
        await job.acquire()
        now = time.monotonic()
        log.grants += 1
        if log.last_holder and log.last_holder != job.name:
            log.latencies.append((now - log.yielded_at) * 1000)
        log.last_holder = job.name
        log.yielded_at = time.monotonic()
        await job.yield_()


async def run_size(stack: LocalStack, groups: int, seconds: float) -> ScaleResult:
    async with timeshare.aio.connect(stack.address) as client:
        logs: list[GroupLog] = []
        jobs: list[tuple[timeshare.aio.Job, GroupLog]] = []
        for g in range(groups):
            log = GroupLog()
            logs.append(log)
            for j in range(JOBS_PER_GROUP[g % len(JOBS_PER_GROUP)]):
                # Each group has a simulated GPU of its own: a GPU is one group's at a time.
                policy = GroupPolicy(gpus=[g])
                job = await client.join(f"scale-{groups}-{g}", f"job-{j}", [stack.node], policy)
                jobs.append((job, log))
        scheduler = stack.processes["scheduler"].pid
        cpu_before = cpu_seconds(scheduler)
        started = time.monotonic()
        await asyncio.gather(*(cycle(job, log, started + seconds) for job, log in jobs))
        elapsed = time.monotonic() - started
        cpu = cpu_seconds(scheduler) - cpu_before
        for job, _ in jobs:
            await job.leave()
    latencies = [ms for log in logs for ms in log.latencies]
    handoffs = len(latencies)
    return ScaleResult(
        groups=groups,
        jobs=len(jobs),
        grants=sum(log.grants for log in logs),
        handoffs=handoffs,
        seconds=elapsed,
        p99_ms=percentile(latencies, 99),
        worker_cpu_ms_per_handoff=cpu * 1000 / max(1, handoffs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Hand-overs per second as groups grow.")
    parser.add_argument("--quick", action="store_true", help="smaller and shorter")
    args = parser.parse_args()
    sizes = [1, 10, 50] if args.quick else [1, 10, 50, 200]
    seconds = 8.0 if args.quick else 20.0
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        stack = LocalStack(Path(scratch), state_gib=0.0, sim_gpus=max(sizes))
        try:
            stack.start_all()
            for groups in sizes:
                results.append(asyncio.run(run_size(stack, groups, seconds)))
                r = results[-1]
                print(f"{groups} groups: {r.handoffs_per_s:.1f} hand-overs/s", flush=True)
        finally:
            stack.stop_all()
    rows = [
        [str(r.groups), str(r.jobs), str(r.grants), f"{r.handoffs_per_s:.1f}", f"{r.p99_ms:.0f}",
         f"{r.worker_cpu_ms_per_handoff:.1f}"]
        for r in results
    ]  # fmt: skip
    print()
    print(
        table(
            ["groups", "jobs", "grants", "hand-overs/s", "p99 ms", "worker cpu ms/hand-over"], rows
        )
    )
    last = results[-1]
    print(
        f"groups={last.groups} handoffs_per_s={last.handoffs_per_s:.1f} p99_ms={last.p99_ms:.0f} "
        f"worker_cpu_ms_per_handoff={last.worker_cpu_ms_per_handoff:.1f}"
    )


if __name__ == "__main__":
    main()
