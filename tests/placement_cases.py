"""Job profiles and GPU sets for the placement tests, built in code."""

from __future__ import annotations

import random

from timeshare.placement.spec import GpuSets, JobSpec, Phase, PlanInput, StackCosts

# The stack adds nothing: the hand-computed cases see only the profiles.
FREE = StackCosts(
    message_seconds=0.0,
    acquire_seconds=0.0,
    yield_seconds=0.0,
    plan_seconds=0.0,
    switch_seconds=0.0,
    grant_seconds=0.0,
)


def job(name: str, *phases: tuple[str, float], state_gib: float = 0.0, gpus: int = 1) -> JobSpec:
    return JobSpec(
        name=name,
        gpus=gpus,
        state_gib=state_gib,
        iteration=[Phase.model_validate({kind: seconds}) for kind, seconds in phases],
    )


def sets(
    count: int = 4,
    gpu_memory_gib: float = 80.0,
    host_memory_gib: float = 512.0,
    bandwidth_gbps: float = 25.0,
) -> GpuSets:
    return GpuSets(
        count=count,
        gpu_memory_gib=gpu_memory_gib,
        host_memory_gib=host_memory_gib,
        bandwidth_gbps=bandwidth_gbps,
        co_residency_margin_gib=0.0,
    )


def random_plan(seed: int, jobs: int, max_slowdown: float = 1.4) -> PlanInput:
    """Jobs of mixed duty cycles and state sizes, some pairs too big for host memory."""
    chooser = random.Random(seed)
    made = []
    for index in range(jobs):
        gpu = chooser.choice([0.2, 0.4, 0.6, 1.0])
        cpu = chooser.choice([0.5, 1.0, 1.5, 2.5])
        made.append(job(f"j{index}", ("gpu", gpu), ("cpu", cpu),
                        state_gib=chooser.choice([2.0, 6.0, 10.0])))  # fmt: skip
    return PlanInput(
        jobs=made,
        gpu_sets=sets(count=jobs, gpu_memory_gib=12.0, host_memory_gib=14.0),
        max_slowdown=max_slowdown,
    )
