"""How fast the placement advisor models, searches and plans (CPU only, no stack).

How fast the placement advisor is: the model on a 4-job group over 100
iterations, the exact search on 10 jobs, the heuristic on 100 jobs. CPU only
(no stack); figures in seconds, minimum and median of several runs where a
run is short.

    python -m bench placement_speed
"""

from __future__ import annotations

import random
import statistics
import time

from timeshare.models import GroupPolicy
from timeshare.placement.evaluate import Evaluator
from timeshare.placement.model import GroupModel
from timeshare.placement.plan import make_plan
from timeshare.placement.spec import GpuSets, JobSpec, Phase, PlanInput, StackCosts

SETS = GpuSets(count=100, gpu_memory_gib=80, host_memory_gib=512, bandwidth_gbps=25)


def mixed_jobs(count: int, seed: int = 7) -> list[JobSpec]:
    """RL-like jobs: sample, reward, train, with duty cycles from about 10 % to 60 %."""
    chooser = random.Random(seed)
    jobs = []
    for index in range(count):
        sample = chooser.uniform(0.5, 6.0)
        reward = chooser.uniform(2.0, 12.0)
        train = chooser.uniform(0.3, 4.0)
        jobs.append(
            JobSpec(
                name=f"job-{index}",
                state_gib=chooser.choice([8.0, 16.0, 24.0, 40.0]),
                iteration=[Phase(gpu=sample), Phase(cpu=reward), Phase(gpu=train)],
            )
        )
    return jobs


def timed(action: object, repeat: int) -> tuple[float, float]:
    assert callable(action)
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return min(seconds), statistics.median(seconds)


def main() -> None:
    four = mixed_jobs(4)
    model_min, model_median = timed(
        lambda: GroupModel(four, SETS, GroupPolicy(), StackCosts()).run(100), repeat=7
    )
    print(f"model, 4 jobs x 100 iterations: {model_min:.3f} s (median {model_median:.3f} s)")
    ten = PlanInput(jobs=mixed_jobs(10), gpu_sets=SETS, max_slowdown=1.5)
    exact_min, _ = timed(lambda: make_plan(Evaluator(ten)), repeat=1)
    print(f"exact search, 10 jobs: {exact_min:.1f} s")
    hundred = PlanInput(jobs=mixed_jobs(100), gpu_sets=SETS, max_slowdown=1.5)
    start = time.perf_counter()
    plan = make_plan(Evaluator(hundred))
    heuristic = time.perf_counter() - start
    s = plan.summary
    print(
        f"heuristic search, 100 jobs: {heuristic:.1f} s ({s.sets_used} sets, busy "
        f"{s.plan_util:.0%}; dedicated {s.sets_dedicated} sets, busy {s.dedicated_util:.0%})"
    )
    print(
        f"model_4x100_s={model_min:.3f} exact_10_s={exact_min:.1f} heuristic_100_s={heuristic:.1f}"
    )


if __name__ == "__main__":
    main()
