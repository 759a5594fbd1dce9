"""Predictions for candidate groups, each simulated once and remembered, and
whether a group is allowed: every job within max_slowdown, the parked states
within host memory."""

from __future__ import annotations

from collections.abc import Iterable

from timeshare.placement.figures import GroupPrediction, steady_state
from timeshare.placement.model import GroupModel
from timeshare.placement.spec import JobSpec, PlanInput

# Iterations measured after the start-up, per candidate group.
STEADY_ITERATIONS = 8
# Slowdowns are compared with this much slack: a tie is not a violation.
SLACK = 1e-9


class Evaluator:
    def __init__(self, plan: PlanInput, steady_iterations: int = STEADY_ITERATIONS) -> None:
        self.plan = plan
        self.jobs = plan.jobs
        self.steady_iterations = steady_iterations
        self._cache: dict[frozenset[int], GroupPrediction] = {}
        # Share of the GPU each job needs at least, at its slowest allowed pace.
        self.demand = [j.gpu_seconds / (plan.max_slowdown * j.iteration_seconds) for j in self.jobs]

    @property
    def simulated(self) -> int:
        return len(self._cache)

    def specs(self, members: Iterable[int]) -> list[JobSpec]:
        return [self.jobs[i] for i in sorted(members)]

    def predict(self, members: Iterable[int]) -> GroupPrediction:
        key = frozenset(members)
        found = self._cache.get(key)
        if found is None:
            specs = self.specs(key)
            run = GroupModel(specs, self.plan.gpu_sets, self.plan.policy, self.plan.costs).run(
                None, steady_iterations=self.steady_iterations
            )
            found = self._cache[key] = steady_state(run, specs)
        return found

    def may_fit(self, members: Iterable[int]) -> bool:
        """A bound that needs no simulation: one job computes at a time, so
        the group's jobs together cannot need more than the whole GPU."""
        return sum(self.demand[i] for i in members) <= 1.0 + SLACK

    def allowed(self, prediction: GroupPrediction) -> bool:
        return (
            prediction.worst_slowdown <= self.plan.max_slowdown + SLACK
            and prediction.peak_host_gib <= self.plan.gpu_sets.host_memory_gib + SLACK
        )

    def feasible(self, members: Iterable[int]) -> bool:
        chosen = frozenset(members)
        return self.may_fit(chosen) and self.allowed(self.predict(chosen))

    def busy(self, members: Iterable[int]) -> float:
        return self.predict(members).busy
