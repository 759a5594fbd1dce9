"""The search: exact against brute force over every partition on small
cases, the heuristic's plans valid and as small as the bound allows, and
input no plan satisfies refused in one line naming the job."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.placement_cases import job, random_plan, sets
from timeshare.placement.evaluate import Evaluator
from timeshare.placement.search import PlanError, exact, heuristic, plan_partition
from timeshare.placement.spec import PlanInput


def partitions(items: list[int]) -> Iterator[list[frozenset[int]]]:
    """Every set partition of ``items``."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for smaller in partitions(rest):
        yield [frozenset([first]), *smaller]
        for index, block in enumerate(smaller):
            yield [*smaller[:index], block | {first}, *smaller[index + 1 :]]


def brute_force(evaluator: Evaluator) -> tuple[int, float]:
    """(fewest sets, most busy) over every partition whose groups the model allows."""
    best: tuple[int, float] | None = None
    for partition in partitions(list(range(len(evaluator.jobs)))):
        if all(evaluator.allowed(evaluator.predict(block)) for block in partition):
            score = (len(partition), -sum(evaluator.busy(block) for block in partition))
            best = score if best is None or score < best else best
    assert best is not None
    return best[0], -best[1]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_exact_search_finds_what_brute_force_finds(seed: int) -> None:
    evaluator = Evaluator(random_plan(seed, jobs=6))
    groups = exact(evaluator)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(evaluator.allowed(evaluator.predict(g)) for g in groups)
    sets_needed, busy = brute_force(evaluator)
    assert len(groups) == sets_needed
    assert sum(evaluator.busy(g) for g in groups) == pytest.approx(busy)


def test_the_cases_are_not_trivial() -> None:
    """Some groups are refused in them (else the brute force proves little):
    for slowdown and for host memory."""
    refused_slow = refused_host = 0
    for seed in (1, 2, 3, 4):
        evaluator = Evaluator(random_plan(seed, jobs=6))
        for pair in ((a, b) for a in range(6) for b in range(a + 1, 6)):
            found = evaluator.predict(pair)
            refused_slow += found.worst_slowdown > evaluator.plan.max_slowdown
            refused_host += found.peak_host_gib > evaluator.plan.gpu_sets.host_memory_gib
    assert refused_slow > 0 and refused_host > 0


def test_the_heuristic_packs_light_jobs_as_tightly_as_the_bound_allows() -> None:
    # Twelve jobs at 20 % duty: four fit a set within a 1.5x slowdown (their
    # demand at that pace adds to 0.53), not seven; the GPU-time bound alone
    # says at least two sets.
    jobs = [job(f"j{i}", ("gpu", 0.2), ("cpu", 0.8), state_gib=1.0) for i in range(12)]
    evaluator = Evaluator(PlanInput(jobs=jobs, gpu_sets=sets(count=12), max_slowdown=1.5))
    groups = heuristic(evaluator, budget_seconds=20.0)
    assert sorted(i for g in groups for i in g) == list(range(12))
    assert all(evaluator.allowed(evaluator.predict(g)) for g in groups)
    best_size = max(len(g) for g in groups)
    assert not evaluator.allowed(evaluator.predict(range(best_size + 1)))
    assert len(groups) == -(-12 // best_size)


def test_a_job_needing_more_gpus_than_a_set_has_is_named() -> None:
    jobs = [job("small", ("gpu", 1.0), ("cpu", 1.0)), job("wide", ("gpu", 1.0), gpus=2)]
    with pytest.raises(PlanError, match=r"^job wide cannot fit anywhere: it needs 2 GPUs"):
        plan_partition(Evaluator(PlanInput(jobs=jobs, gpu_sets=sets())))


def test_a_state_larger_than_the_gpu_is_named() -> None:
    jobs = [job("huge", ("gpu", 1.0), ("cpu", 1.0), state_gib=100.0)]
    with pytest.raises(PlanError, match=r"^job huge cannot fit anywhere: it holds 100 GiB"):
        plan_partition(Evaluator(PlanInput(jobs=jobs, gpu_sets=sets())))


def test_too_few_sets_names_a_job_that_has_no_room() -> None:
    # Three busy jobs that cannot share within 1.2x, and two sets.
    jobs = [job(f"busy-{i}", ("gpu", 2.0), ("cpu", 1.0)) for i in range(3)]
    plan = PlanInput(jobs=jobs, gpu_sets=sets(count=2), max_slowdown=1.2)
    with pytest.raises(PlanError) as refused:
        plan_partition(Evaluator(plan))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("job busy-") and "need 3 GPU sets" in message
    assert "2 are given" in message
