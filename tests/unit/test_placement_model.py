"""The group model against cases worked out by hand. With the stack's own
costs set to zero the figures are exact: the model is the real scheduling
core stepped through virtual time, so these also pin what the core decides."""

from __future__ import annotations

import pytest

from tests.placement_cases import FREE, job, sets
from timeshare.models import GroupPolicy
from timeshare.placement.figures import steady_state, whole_run
from timeshare.placement.model import GroupModel
from timeshare.placement.profile import profile_job
from timeshare.placement.spec import GIB, StackCosts

OFF = GroupPolicy(co_residency="off")


def test_two_jobs_at_forty_percent_with_free_switches_interleave_perfectly() -> None:
    # a: GPU 0-1, CPU 1-2.5; b waits, GPU 1-2, CPU 2-3.5; a asks again at 2.5
    # and finds the GPU free: neither waits again, each iteration takes 2.5 s.
    jobs = [job(name, ("gpu", 1.0), ("cpu", 1.5)) for name in ("a", "b")]
    steady = steady_state(GroupModel(jobs, sets(), OFF, FREE).run(None, steady_iterations=10), jobs)
    assert steady.busy == pytest.approx(0.8)
    assert steady.slowdown == pytest.approx({"a": 1.0, "b": 1.0})
    # Three iterations each: a ends at 7.5 s, b (a second behind) at 8.5 s.
    whole = whole_run(GroupModel(jobs, sets(), OFF, FREE).run(3), jobs)
    assert whole.busy == pytest.approx(6.0 / 8.5)
    assert whole.slowdown == pytest.approx({"a": 1.0, "b": 8.5 / 7.5})


def test_an_oversubscribed_group_saturates_the_gpu_and_shares_it_round_robin() -> None:
    # Three jobs that each want the GPU two thirds of the time: the GPU is
    # always busy, each job gets one turn in three, a 1.5 s iteration takes 3 s.
    jobs = [job(name, ("gpu", 1.0), ("cpu", 0.5)) for name in ("a", "b", "c")]
    run = GroupModel(jobs, sets(), OFF, FREE).run(None, steady_iterations=10)
    steady = steady_state(run, jobs)
    assert steady.busy == pytest.approx(1.0)
    assert steady.slowdown == pytest.approx({"a": 2.0, "b": 2.0, "c": 2.0})
    # A hand-over that costs 0.1 s: every turn follows one, the cycle is 3.3 s.
    costly = FREE.model_copy(update={"switch_seconds": 0.1})
    run = GroupModel(jobs, sets(), OFF, costly).run(None, steady_iterations=10)
    steady = steady_state(run, jobs)
    assert steady.busy == pytest.approx(3.0 / 3.3)
    assert steady.slowdown == pytest.approx({"a": 2.2, "b": 2.2, "c": 2.2})


def test_a_pair_whose_states_do_not_fit_host_memory_parks_both_at_once() -> None:
    # Each fits the GPU alone, not both: every switch checkpoints one and
    # restores the other, and between the two both sit in host memory.
    jobs = [job(name, ("gpu", 1.0), ("cpu", 1.5), state_gib=300.0) for name in ("a", "b")]
    small_gpu = sets(gpu_memory_gib=400.0, host_memory_gib=512.0, bandwidth_gbps=300 * GIB / 1e9)
    run = GroupModel(jobs, small_gpu, GroupPolicy(), FREE).run(None, steady_iterations=10)
    steady = steady_state(run, jobs)
    assert steady.peak_host_gib == pytest.approx(600.0)
    # One second each way per switch (300 GiB at 300 GiB/s), two per hand-over:
    # a's turns are 1 s, then 2 s of switch, b's 1 s, 2 s of switch: 6 s a cycle
    # in which each job computes 1 s; its 2.5 s iteration takes 6 s.
    assert steady.busy == pytest.approx(2.0 / 6.0)
    assert steady.slowdown == pytest.approx({"a": 6.0 / 2.5, "b": 6.0 / 2.5})
    # With room on the GPU for both, nothing is parked and nothing moves.
    roomy = sets(gpu_memory_gib=600.0, host_memory_gib=512.0, bandwidth_gbps=300 * GIB / 1e9)
    run = GroupModel(jobs, roomy, GroupPolicy(), FREE).run(None, steady_iterations=10)
    assert steady_state(run, jobs).peak_host_gib == 0.0
    assert run.bytes_moved == 0


def test_a_lone_job_is_switched_in_once_and_then_reacquires_lazily() -> None:
    jobs = [job("a", ("gpu", 0.5), ("cpu", 0.5), ("gpu", 0.2), state_gib=4.0)]
    costs = StackCosts()
    run = GroupModel(jobs, sets(), OFF, costs).run(20)
    assert run.switches == 1 and run.bytes_moved == 0
    # Each turn costs the job an acquire and a yield round trip, nothing else.
    per_iteration = 1.2 + 2 * (costs.acquire_seconds + costs.yield_seconds)
    # (after the first, which waited for the switch that brought it in).
    took = (run.jobs["a"].boundaries[-1] - run.jobs["a"].boundaries[1]) / 19
    assert took == pytest.approx(per_iteration)


def test_a_turn_limit_preempts_through_the_queue_and_the_job_resumes_where_it_was() -> None:
    # a computes 10 s in one turn; b waits. With max_turn 2 s and a 1 s grace
    # the queue preempts a at 3 s, 7 s and 11 s (each time 2 s after its turn
    # resumed or b asked, whichever is later, plus the grace); b computes
    # 3-4, 7-8, 11-12 (its three iterations); a's 10 s of work end at 13 s,
    # its CPU phase at 14 s.
    policy = GroupPolicy(co_residency="off", max_turn_seconds=2.0, preempt_grace_seconds=1.0)
    jobs = [job("a", ("gpu", 10.0), ("cpu", 1.0)), job("b", ("gpu", 1.0), ("cpu", 1.0))]
    run = GroupModel(jobs, sets(), policy, FREE).run(3)
    assert run.jobs["a"].boundaries[1] == pytest.approx(14.0)
    assert run.jobs["a"].work[:4] == [(0, 3), (4, 7), (8, 11), (12, 13)]
    assert run.jobs["b"].work == [(3, 4), (7, 8), (11, 12)]


def test_a_profile_of_the_models_own_history_gives_back_the_profiles() -> None:
    jobs = [
        job("a", ("gpu", 0.6), ("cpu", 1.5), ("gpu", 0.4), state_gib=3.0),
        job("b", ("gpu", 1.0), ("cpu", 2.0), state_gib=5.0),
        job("c", ("gpu", 0.2), ("cpu", 0.3), ("gpu", 0.2), ("cpu", 1.0), ("gpu", 0.1),
            state_gib=1.0),
    ]  # fmt: skip
    # a names its turns as an RL job would; the history keeps the names.
    named = [p.model_copy(update={"phase": n}) for p, n in zip(
        jobs[0].iteration, ["rollout", "", "train"], strict=True)]  # fmt: skip
    jobs[0] = jobs[0].model_copy(update={"iteration": named})
    costs = StackCosts()
    run = GroupModel(jobs, sets(), OFF, costs, record_history=True).run(30)
    assert run.history is not None
    for spec in jobs:
        found = profile_job(spec.name, ["set-1"], run.history, costs)
        assert [p.on_gpu for p in found.iteration] == [p.on_gpu for p in spec.iteration]
        assert [p.phase for p in found.iteration] == [p.phase for p in spec.iteration]
        assert [p.seconds for p in found.iteration] == pytest.approx(
            [p.seconds for p in spec.iteration]
        )
        assert found.state_gib == pytest.approx(spec.state_gib)
        assert found.measured is not None
        assert found.measured.duty_cycle == pytest.approx(spec.duty_cycle)


def test_the_groups_ordering_weights_and_priorities_are_the_queues() -> None:
    # Three jobs that always want the GPU for 1 s. FIFO: round robin, each
    # waits for the other two, 3 s an iteration. Fair share with weight 3 for
    # one: whenever it is among the waiters it has used least for its weight
    # and goes first, so it takes every other turn (2 s an iteration) and
    # the two others alternate in between (4 s).
    weighted = [job("heavy", ("gpu", 1.0)).model_copy(update={"weight": 3.0}),
                job("light", ("gpu", 1.0)), job("light2", ("gpu", 1.0))]  # fmt: skip
    slowdown = {}
    for ordering in ("fifo", "fair"):
        policy = GroupPolicy(co_residency="off", ordering=ordering)
        run = GroupModel(weighted, sets(), policy, FREE).run(None, steady_iterations=30)
        slowdown[ordering] = steady_state(run, weighted).slowdown
    assert slowdown["fifo"] == pytest.approx({"heavy": 3.0, "light": 3.0, "light2": 3.0})
    assert slowdown["fair"] == pytest.approx({"heavy": 2.0, "light": 4.0, "light2": 4.0})
    # A higher priority goes first whatever the ordering: the same for jobs
    # that each compute 1 s and think 0.5 s.
    ranked = [job(name, ("gpu", 1.0), ("cpu", 0.5)) for name in ("hi", "lo", "lo2")]
    ranked[0] = ranked[0].model_copy(update={"priority": 1})
    run = GroupModel(ranked, sets(), OFF, FREE).run(None, steady_iterations=12)
    assert steady_state(run, ranked).slowdown == pytest.approx(
        {"hi": 2.0 / 1.5, "lo": 4.0 / 1.5, "lo2": 4.0 / 1.5}
    )
