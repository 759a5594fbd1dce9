"""A plan, the two it is compared with (dedicated GPUs, and the naive plan
that pairs jobs in input order), and plan.json: the groups and how to launch
each job into its group."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from timeshare.models import GroupPolicy
from timeshare.placement.arguments import TIME_LIMIT_SECONDS
from timeshare.placement.evaluate import Evaluator
from timeshare.placement.figures import GroupPrediction
from timeshare.placement.search import Partition, plan_partition
from timeshare.status import table


class PlannedGroup(BaseModel):
    group: str
    node: str
    jobs: list[str]
    predicted_busy: float
    predicted_slowdown: dict[str, float]
    peak_host_gib: float
    allowed: bool


class LaunchSettings(BaseModel):
    job: str
    group: str
    node: str
    # The environment the client library reads: join() with no arguments
    # joins this group as this job on this node.
    env: dict[str, str]


class PlanSummary(BaseModel):
    plan_util: float
    naive_util: float
    dedicated_util: float
    sets_used: int
    sets_dedicated: int
    max_slowdown: float
    sets_naive: int
    naive_allowed: bool

    def line(self) -> str:
        return (
            f"plan_util={self.plan_util:.3f} naive_util={self.naive_util:.3f} "
            f"dedicated_util={self.dedicated_util:.3f} sets_used={self.sets_used} "
            f"sets_dedicated={self.sets_dedicated} max_slowdown={self.max_slowdown:.3f}"
        )


class PlanFile(BaseModel):
    method: str
    groups_simulated: int
    # The group policy to create each group with (the first join's `policy`).
    policy: GroupPolicy
    groups: list[PlannedGroup]
    launch: list[LaunchSettings]
    dedicated: list[PlannedGroup]
    naive: list[PlannedGroup]
    summary: PlanSummary


def _groups(
    evaluator: Evaluator, partition: Sequence[frozenset[int]], prefix: str
) -> list[PlannedGroup]:
    planned = []
    for index, members in enumerate(partition):
        prediction: GroupPrediction = evaluator.predict(members)
        planned.append(
            PlannedGroup(
                group=f"{prefix}-{index + 1}",
                node=evaluator.plan.gpu_sets.node(index),
                jobs=[evaluator.jobs[i].name for i in sorted(members)],
                predicted_busy=prediction.busy,
                predicted_slowdown=prediction.slowdown,
                peak_host_gib=prediction.peak_host_gib,
                allowed=evaluator.allowed(prediction),
            )
        )
    return planned


def _util(groups: Sequence[PlannedGroup]) -> float:
    return sum(g.predicted_busy for g in groups) / len(groups)


def make_plan(
    evaluator: Evaluator, prefix: str = "share", budget_seconds: float = TIME_LIMIT_SECONDS
) -> PlanFile:
    """Raises PlanError (one line) when no plan fits."""
    partition: Partition = plan_partition(evaluator, budget_seconds)
    jobs = range(len(evaluator.jobs))
    groups = _groups(evaluator, partition.groups, prefix)
    dedicated = _groups(evaluator, [frozenset([i]) for i in jobs], "alone")
    naive = _groups(
        evaluator, [frozenset(jobs[i : i + 2]) for i in range(0, len(jobs), 2)], "naive"
    )
    launch = [
        LaunchSettings(
            job=job,
            group=group.group,
            node=group.node,
            env={
                "TIMESHARE_GROUP": group.group,
                "TIMESHARE_JOB": job,
                "TIMESHARE_NODES": group.node,
            },
        )
        for group in groups
        for job in group.jobs
    ]
    summary = PlanSummary(
        plan_util=_util(groups),
        naive_util=_util(naive),
        dedicated_util=_util(dedicated),
        sets_used=len(groups),
        sets_dedicated=len(dedicated),
        max_slowdown=max(s for g in groups for s in g.predicted_slowdown.values()),
        sets_naive=len(naive),
        naive_allowed=all(g.allowed for g in naive),
    )
    return PlanFile(
        method=partition.method,
        groups_simulated=partition.simulated,
        policy=GroupPolicy.model_validate(evaluator.plan.policy.model_dump()),
        groups=groups,
        launch=launch,
        dedicated=dedicated,
        naive=naive,
        summary=summary,
    )


def groups_table(groups: Sequence[PlannedGroup], max_slowdown: float, host_gib: float) -> str:
    rows = []
    for group in groups:
        worst = max(group.predicted_slowdown.values())
        verdict = "ok"
        if worst > max_slowdown + 1e-9:
            verdict = f"over max_slowdown {max_slowdown:g}"
        elif group.peak_host_gib > host_gib + 1e-9:
            verdict = f"over {host_gib:g} GiB host memory"
        rows.append(
            [
                group.group,
                group.node,
                f"{group.predicted_busy:.0%}",
                ", ".join(f"{job} {group.predicted_slowdown[job]:.2f}x" for job in group.jobs),
                f"{group.peak_host_gib:.1f}",
                verdict,
            ]
        )
    return table(["group", "node", "busy", "jobs (slowdown)", "host GiB", "check"], rows)


def render(plan: PlanFile, max_slowdown: float, host_gib: float) -> str:
    s = plan.summary
    parts = [
        f"plan ({plan.method} search, {plan.groups_simulated} groups simulated): "
        f"{s.sets_used} GPU sets, busy {s.plan_util:.0%} on average",
        groups_table(plan.groups, max_slowdown, host_gib),
        "",
        f"dedicated: {s.sets_dedicated} GPU sets, busy {s.dedicated_util:.0%} on average",
        groups_table(plan.dedicated, max_slowdown, host_gib),
        "",
        f"naive (input order, in pairs): {s.sets_naive} GPU sets, busy {s.naive_util:.0%} "
        f"on average{'' if s.naive_allowed else '; breaks the limits'}",
        groups_table(plan.naive, max_slowdown, host_gib),
        "",
        s.line(),
    ]
    return "\n".join(parts)
