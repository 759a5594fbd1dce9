"""Scheduling policies on the real stack: fair share, priority waits, trainer-first steps.

Sim backend, one node, **simulated** GPU: who gets the GPU, how long each waits.

    python -m bench policy            # 40 s per scenario
    python -m bench policy --quick    # 12 s per scenario
    python -m bench policy --seconds S

The scenarios (fairness, two busy jobs, priority, trainer-first) and their
figures: docs/benchmarks.md, "Scheduling policies".
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
import uuid
from dataclasses import asdict, dataclass, field

import timeshare.aio
from bench.parts.stack import running_stack
from bench.parts.stats import percentile
from timeshare.models import GroupPolicy
from timeshare.status import table
from timeshare.testing import LocalStack


@dataclass
class Log:
    waits: dict[str, list[float]] = field(default_factory=dict)
    steps: list[float] = field(default_factory=list)

    def wait(self, job: str, seconds: float) -> None:
        self.waits.setdefault(job, []).append(seconds)


def jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 0.0


async def busy(job: timeshare.aio.Job, hold: float, until: float, log: Log, gap: float = 0.0,
               phase: str = "", every: float = 0.0) -> None:  # fmt: skip
    """Ask again as soon as the turn is given back, plus ``gap`` off the GPU,
    or ``every`` seconds from the last ask; each ask to the next is a step."""
    clock = asyncio.get_running_loop().time
    while clock() < until:
        asked = clock()
        async with job.turn(phase=phase):
            log.wait(job.name, clock() - asked)
            await asyncio.sleep(hold)
        if gap or every:
            await asyncio.sleep(max(gap, every - (clock() - asked)))
        log.steps.append(clock() - asked)


async def fairness(stack: LocalStack, ordering: str, seconds: float) -> float:
    group = f"fair-{ordering}-{uuid.uuid4().hex[:6]}"
    policy = GroupPolicy(ordering=ordering)  # type: ignore[arg-type]
    async with timeshare.aio.connect(stack.address) as api:
        long = await api.join(group, "long", nodes=[stack.node], policy=policy)
        shorts = [await api.join(group, f"short-{n}", nodes=[stack.node]) for n in range(2)]
        until = asyncio.get_running_loop().time() + seconds
        log = Log()
        await asyncio.gather(
            busy(long, 0.6, until, log), *(busy(short, 0.1, until, log) for short in shorts)
        )
        status = await api.get_group(group)
        for job in (long, *shorts):
            await job.leave()
    return jain([j.held_seconds for j in status.jobs])


@dataclass
class TwoJobs:
    ratio: float  # the larger job's GPU-seconds over the smaller's
    handovers: int
    idle_ms_per_handover: float
    busy: float  # the share of the run the GPU was held


async def two_jobs(stack: LocalStack, anticipation: bool, seconds: float) -> TwoJobs:
    """Two jobs always want the GPU: one holds 0.4 s turns, the other 0.07 s."""
    group = f"two-{'ant' if anticipation else 'off'}-{uuid.uuid4().hex[:6]}"
    policy = GroupPolicy() if anticipation else GroupPolicy(fair_anticipation_seconds=0)
    async with timeshare.aio.connect(stack.address) as api:
        long = await api.join(group, "long", nodes=[stack.node], policy=policy)
        short = await api.join(group, "short", nodes=[stack.node])
        until = asyncio.get_running_loop().time() + seconds
        log = Log()
        await asyncio.gather(busy(long, 0.4, until, log), busy(short, 0.07, until, log))
        status = await api.get_group(group)
        history = await api.group_history(group)
        for job in (long, short):
            await job.leave()
    held = [j.held_seconds for j in status.jobs]
    turns = sorted(history.turns, key=lambda t: t.epoch)
    handovers = idle = 0.0
    for n, (before, after) in enumerate(itertools.pairwise(turns)):
        # The GPU sat idle from one turn's end to the next one's start (its
        # switch aside) while a job that had asked waited: a turn held open
        # for its yielder costs that job's own gap before it asks again.
        waited = any(t.requested_at <= before.released_at for t in turns[n + 1 :])
        if before.released_at and waited:
            idle += max(0.0, after.granted_at - after.switch_seconds - before.released_at)
        handovers += before.job != after.job
    return TwoJobs(
        ratio=max(held) / min(held) if min(held) > 0 else float("inf"),
        handovers=int(handovers),
        idle_ms_per_handover=1000 * idle / handovers if handovers else 0.0,
        busy=sum(held) / seconds,
    )


async def priority(stack: LocalStack, prioritised: bool, seconds: float) -> tuple[float, float]:
    group = f"prio-{'on' if prioritised else 'off'}-{uuid.uuid4().hex[:6]}"
    async with timeshare.aio.connect(stack.address) as api:
        lows = [await api.join(group, f"low-{i}", nodes=[stack.node]) for i in range(3)]
        high = await api.join(group, "high", nodes=[stack.node], priority=5 if prioritised else 0)
        until = asyncio.get_running_loop().time() + seconds
        log = Log()
        await asyncio.gather(busy(high, 0.2, until, log, every=1.0),
                             *(busy(j, 0.3, until, log, gap=0.05) for j in lows))  # fmt: skip
        for job in [*lows, high]:
            await job.leave()
    low_waits = [w for job, waits in log.waits.items() if job != "high" for w in waits]
    return percentile(log.waits["high"], 50), percentile(low_waits, 50)


async def trainer_first(stack: LocalStack, variant: str, seconds: float) -> float:
    """The trainer's mean step time (0.5 s on the GPU, 0.5 s off it)."""
    slug = "-".join(word for word in variant.split() if word != "+")
    group = f"trainer-{slug}-{uuid.uuid4().hex[:6]}"
    policies = {
        "alone": GroupPolicy(),
        "fifo": GroupPolicy(ordering="fifo"),
        "phase priority": GroupPolicy(phase_priority={"train": 10}),
        "phase priority + preemption": GroupPolicy(
            phase_priority={"train": 10}, preempt_lower_after_seconds=0.1
        ),
    }
    async with timeshare.aio.connect(stack.address) as api:
        trainer = await api.join(group, "trainer", nodes=[stack.node], policy=policies[variant])
        batch = [] if variant == "alone" else [
            await api.join(group, f"batch-{i}", nodes=[stack.node]) for i in range(2)
        ]  # fmt: skip
        until = asyncio.get_running_loop().time() + seconds
        log = Log()  # the trainer's alone
        rollouts = [busy(j, 0.5, until, Log(), phase="rollout") for j in batch]
        await asyncio.gather(busy(trainer, 0.5, until, log, gap=0.5, phase="train"), *rollouts)
        for job in [trainer, *batch]:
            await job.leave()
    return sum(log.steps) / len(log.steps)


async def run(stack: LocalStack, seconds: float) -> dict[str, float]:
    figures: dict[str, float] = {}
    for ordering in ("fifo", "fair"):
        figures[f"{ordering}_jain"] = await fairness(stack, ordering, seconds)
        print(f"fairness {ordering}: Jain {figures[f'{ordering}_jain']:.3f}", flush=True)
    for anticipation in (True, False):
        pair = await two_jobs(stack, anticipation, seconds)
        key = "two_jobs" if anticipation else "two_jobs_no_anticipation"
        figures.update({f"{key}_{name}": value for name, value in asdict(pair).items()})
        print(
            f"two jobs (0.4 s and 0.07 s turns), anticipation {'on' if anticipation else 'off'}: "
            f"GPU time {pair.ratio:.2f}x, {pair.handovers} hand-overs, "
            f"{pair.idle_ms_per_handover:.1f} ms idle per hand-over, GPU held {pair.busy:.0%}",
            flush=True,
        )
    for prioritised in (False, True):
        high, low = await priority(stack, prioritised, seconds)
        key = "priority" if prioritised else "same_priority"
        figures[f"{key}_high_wait_p50_ms"] = high * 1000
        figures[f"{key}_low_wait_p50_ms"] = low * 1000
        print(f"{key}: high p50 wait {high * 1000:.0f} ms, low {low * 1000:.0f} ms", flush=True)
    for variant in ("alone", "fifo", "phase priority", "phase priority + preemption"):
        step = await trainer_first(stack, variant, seconds)
        figures[f"trainer_step_{variant.replace(' + ', '_').replace(' ', '_')}_s"] = step
        print(f"trainer step, {variant}: {step:.2f} s", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description="Fair share, priorities and phase priority.")
    parser.add_argument("--quick", action="store_true", help="shorter scenarios")
    parser.add_argument("--seconds", type=float, help="per scenario (default 40, quick 12)")
    args = parser.parse_args()
    seconds = args.seconds or (12.0 if args.quick else 40.0)
    started = time.monotonic()
    with running_stack(state_gib=0.0) as stack:
        figures = asyncio.run(run(stack, seconds))
    print()
    print(table(
        ["measure", "value"],
        [[name, f"{value:.3f}" if "jain" in name else f"{value:.2f}"]
         for name, value in figures.items()],
    ))  # fmt: skip
    print(f"(simulated GPU, {seconds:g} s per scenario, {time.monotonic() - started:.0f} s in all)")
    print(" ".join(f"{name}={value:.3f}" for name, value in figures.items()))


if __name__ == "__main__":
    main()
