"""Which jobs share which GPU set. Goals, in order: the fewest GPU sets with
every job within max_slowdown and every group's parked states within host
memory; then the highest predicted utilisation (the sum of the groups' busy
fractions, so the mean over the sets used).

Up to EXACT_JOBS jobs the search is exact: every allowed group is simulated
and a dynamic programme over subsets picks the best partition. It skips a
group whose smaller groups are not all allowed (adding a job never makes the
others faster) and one whose jobs need more than the GPU (the demand bound).
Beyond that, best-fit decreasing places the most demanding jobs first, each
in the fullest group it is allowed into (of the GREEDY_TRIES fullest that the
demand bound lets through), then local search empties the emptiest groups
into others (one GPU set fewer each time) and swaps or moves jobs between
groups while the utilisation rises, all within one time budget.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass

from timeshare.placement.arguments import TIME_LIMIT_SECONDS
from timeshare.placement.evaluate import SLACK, Evaluator
from timeshare.scheduling.base import MAX_JOBS_PER_GROUP

EXACT_JOBS = 10
# Candidate groups simulated per job in the greedy pass, fullest first.
GREEDY_TRIES = 6


class PlanError(ValueError):
    """Input no plan can satisfy; the message is one line naming the job."""


@dataclass
class Partition:
    groups: list[frozenset[int]]
    method: str
    simulated: int = 0

    def busy(self, evaluator: Evaluator) -> float:
        return sum(evaluator.busy(g) for g in self.groups)


def plan_partition(evaluator: Evaluator, budget_seconds: float = TIME_LIMIT_SECONDS) -> Partition:
    check_each_job(evaluator)
    jobs = len(evaluator.jobs)
    if jobs <= EXACT_JOBS:
        groups = exact(evaluator)
        method = "exact"
    else:
        groups = heuristic(evaluator, budget_seconds)
        method = "heuristic"
    groups = sorted(groups, key=lambda g: min(g))
    check_count(evaluator, groups)
    return Partition(groups, method, evaluator.simulated)


def check_each_job(evaluator: Evaluator) -> None:
    """Every job must fit a GPU set alone, or no plan exists."""
    sets = evaluator.plan.gpu_sets
    limit = evaluator.plan.max_slowdown
    for index, job in enumerate(evaluator.jobs):
        assert job.state_gib is not None
        if job.gpus > sets.gpus:
            raise PlanError(f"job {job.name} cannot fit anywhere: it needs {job.gpus} GPUs "
                            f"and a GPU set has {sets.gpus}")  # fmt: skip
        if job.state_gib > sets.gpu_memory_gib:
            raise PlanError(
                f"job {job.name} cannot fit anywhere: it holds {job.state_gib:g} GiB on the "
                f"GPU and a GPU set has {sets.gpu_memory_gib:g} GiB"
            )
        alone = evaluator.predict([index]).worst_slowdown
        if alone > limit + SLACK:
            raise PlanError(
                f"job {job.name} cannot fit anywhere: even alone it runs {alone:.2f}x slower "
                f"than its profile (the stack's round trips on its {job.turns_per_iteration} "
                f"turns per iteration), above max_slowdown {limit:g}"
            )


def check_count(evaluator: Evaluator, groups: list[frozenset[int]]) -> None:
    count = evaluator.plan.gpu_sets.count
    if len(groups) <= count:
        return
    # The job left over: the least busy group's most demanding job.
    spare = min(groups, key=evaluator.busy)
    job = evaluator.jobs[max(spare, key=lambda i: evaluator.demand[i])]
    raise PlanError(
        f"job {job.name} cannot fit anywhere: the jobs need {len(groups)} GPU sets to keep "
        f"every job within max_slowdown {evaluator.plan.max_slowdown:g} and every group within "
        f"{evaluator.plan.gpu_sets.host_memory_gib:g} GiB of host memory, and {count} are given"
    )


# -- exact -------------------------------------------------------------------------


def allowed_groups(evaluator: Evaluator) -> dict[int, float]:
    """Every allowed group as a bit mask, with its predicted busy fraction."""
    jobs = len(evaluator.jobs)
    allowed: dict[int, float] = {}
    for size in range(1, min(jobs, MAX_JOBS_PER_GROUP) + 1):
        grew = False
        for members in itertools.combinations(range(jobs), size):
            mask = sum(1 << i for i in members)
            if size > 1 and any(mask & ~(1 << i) not in allowed for i in members):
                continue
            if evaluator.feasible(members):
                allowed[mask] = evaluator.busy(members)
                grew = True
        if not grew:
            break
    return allowed


def exact(evaluator: Evaluator) -> list[frozenset[int]]:
    allowed = allowed_groups(evaluator)
    jobs = len(evaluator.jobs)
    best: dict[int, tuple[int, float, tuple[int, ...]]] = {0: (0, 0.0, ())}

    def solve(mask: int) -> tuple[int, float, tuple[int, ...]]:
        found = best.get(mask)
        if found is not None:
            return found
        lowest = mask & -mask
        rest = mask ^ lowest
        choice: tuple[int, float, tuple[int, ...]] | None = None
        sub = rest
        while True:
            group = sub | lowest
            if group in allowed:
                sets, lost, blocks = solve(mask ^ group)
                candidate = (sets + 1, lost - allowed[group], (group, *blocks))
                if choice is None or candidate[:2] < choice[:2]:
                    choice = candidate
            if sub == 0:
                break
            sub = (sub - 1) & rest
        # Every job is allowed alone (check_each_job), so a choice exists.
        assert choice is not None
        best[mask] = choice
        return choice

    _, _, blocks = solve((1 << jobs) - 1)
    return [frozenset(i for i in range(jobs) if block >> i & 1) for block in blocks]


# -- heuristic ---------------------------------------------------------------------


def heuristic(evaluator: Evaluator, budget_seconds: float) -> list[frozenset[int]]:
    deadline = time.monotonic() + budget_seconds
    groups = best_fit(evaluator, deadline)
    improved = True
    while improved and time.monotonic() < deadline:
        improved = empty_a_group(evaluator, groups, deadline)
    swap_while_better(evaluator, groups, deadline)
    return [frozenset(g) for g in groups if g]


def _load(evaluator: Evaluator, group: set[int]) -> float:
    return sum(evaluator.demand[i] for i in group)


def best_fit(evaluator: Evaluator, deadline: float) -> list[set[int]]:
    """Past the deadline, every job left gets a group of its own."""
    order = sorted(range(len(evaluator.jobs)), key=lambda i: (-evaluator.demand[i], i))
    groups: list[set[int]] = []
    for job in order:
        target = None
        if time.monotonic() < deadline:
            target = _fullest_allowed(evaluator, groups, job, exclude=None)
        if target is None:
            groups.append({job})
        else:
            target.add(job)
    return groups


def _fullest_allowed(
    evaluator: Evaluator, groups: list[set[int]], job: int, exclude: set[int] | None
) -> set[int] | None:
    candidates = [
        g for g in groups
        if g is not exclude and len(g) < MAX_JOBS_PER_GROUP and evaluator.may_fit(g | {job})
    ]  # fmt: skip
    candidates.sort(key=lambda g: (-_load(evaluator, g), min(g)))
    for group in candidates[:GREEDY_TRIES]:
        if evaluator.feasible(group | {job}):
            return group
    return None


def empty_a_group(evaluator: Evaluator, groups: list[set[int]], deadline: float) -> bool:
    """Move every job of the emptiest group it can be emptied of into others:
    one GPU set fewer."""
    for victim in sorted(groups, key=lambda g: _load(evaluator, g)):
        if time.monotonic() > deadline:
            return False
        trial = [set(g) for g in groups if g is not victim]
        for job in sorted(victim, key=lambda i: -evaluator.demand[i]):
            target = _fullest_allowed(evaluator, trial, job, exclude=None)
            if target is None:
                break
            target.add(job)
        else:
            groups[:] = trial
            return True
    return False


def swap_while_better(evaluator: Evaluator, groups: list[set[int]], deadline: float) -> None:
    """Swap two jobs of different groups, or move one, while the sum of busy
    fractions rises and both groups stay allowed."""
    chooser = random.Random(0)
    stale = 0
    while time.monotonic() < deadline and stale < 4 * len(evaluator.jobs) and len(groups) > 1:
        a, b = chooser.sample(range(len(groups)), 2)
        first, second = groups[a], groups[b]
        x = chooser.choice(sorted(first))
        ys = [None, *sorted(second)]
        y = chooser.choice(ys)
        new_first = (first - {x}) | ({y} if y is not None else set())
        new_second = (second - ({y} if y is not None else set())) | {x}
        if not new_first:
            stale += 1
            continue
        before = evaluator.busy(first) + evaluator.busy(second)
        if (
            evaluator.feasible(new_first)
            and evaluator.feasible(new_second)
            and evaluator.busy(new_first) + evaluator.busy(new_second) > before + 1e-6
        ):
            groups[a], groups[b] = new_first, new_second
            stale = 0
        else:
            stale += 1
