"""`timeshare plan --from-groups`: profile every live group, predict how the
groups do now, plan the same jobs afresh, and say which moves would raise
utilisation or free GPU sets. It moves nothing."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pydantic import BaseModel, Field

import timeshare
from timeshare.history import GroupHistory
from timeshare.models import GroupStatus
from timeshare.placement.arguments import TIME_LIMIT_SECONDS
from timeshare.placement.evaluate import Evaluator
from timeshare.placement.profile import profile_group
from timeshare.placement.search import plan_partition
from timeshare.placement.spec import GB, GpuSets, JobSpec, PlanInput, StackCosts, StrictPolicy

# Device<->host GB/s assumed where the histories cannot tell (PCIe 4 x16, roughly).
DEFAULT_BANDWIDTH_GBPS = 25.0


class LiveSettings(BaseModel):
    max_slowdown: float = Field(default=1.5, ge=1.0)
    gpu_memory_gib: float = Field(default=80.0, gt=0.0)
    host_memory_gib: float = Field(default=512.0, ge=0.0)
    # None: as the group histories' switches measured it.
    bandwidth_gbps: float | None = Field(default=None, gt=0.0)
    co_residency_margin_gib: float = Field(default=2.0, ge=0.0)
    # State of jobs never checkpointed (their histories cannot tell), GiB.
    states: dict[str, float] = Field(default_factory=dict)
    # Only these groups (default: every live group).
    groups: list[str] | None = None
    budget_seconds: float = TIME_LIMIT_SECONDS


class Advice(BaseModel):
    jobs: list[str]
    current: list[tuple[str, list[str], float]]
    suggested: list[tuple[str, list[str], float]]
    moves: list[str]
    freed: list[str]
    notes: list[str]
    current_util: float
    suggested_util: float
    worst_now: float
    worst_suggested: float

    def line(self) -> str:
        return (
            f"current_util={self.current_util:.3f} suggested_util={self.suggested_util:.3f} "
            f"sets_now={len(self.current)} sets_suggested={len(self.suggested)} "
            f"moves={len(self.moves)}"
        )


def measured_bandwidth(histories: Sequence[GroupHistory], costs: StackCosts) -> float | None:
    """GB/s the recorded switches moved their bytes at, beyond the switch's own
    cost; only switches whose transfers took longer than that cost say much."""
    rates = [
        s.bytes_moved / (s.finished_at - s.started_at - costs.switch_seconds) / GB
        for h in histories
        for s in h.switches
        if s.ok and s.bytes_moved and s.finished_at - s.started_at > 2 * costs.switch_seconds
    ]
    return statistics.median(rates) if rates else None


def gather(
    address: str | None, settings: LiveSettings
) -> tuple[list[GroupStatus], list[GroupHistory]]:
    with timeshare.connect(address) as client:
        wanted = settings.groups
        statuses = (
            [client.get_group(g) for g in wanted] if wanted is not None else client.list_groups()
        )
        statuses = [s for s in statuses if s.jobs]
        return statuses, [client.group_history(s.group) for s in statuses]


Row = tuple[str, list[str], float]


class LiveJobs(BaseModel):
    jobs: list[JobSpec]
    # The live group of each job.
    home: list[str]
    notes: list[str]


def live_jobs(
    statuses: Sequence[GroupStatus],
    histories: Sequence[GroupHistory],
    settings: LiveSettings,
    costs: StackCosts,
) -> LiveJobs:
    """The profiled jobs that may move; a note for each that stays, and why."""
    found = LiveJobs(jobs=[], home=[], notes=[])
    names = [job.job for s in statuses for job in s.jobs]
    for status, history in zip(statuses, histories, strict=True):
        members = {job.job for job in status.jobs}
        profiles, skipped = profile_group(status, history, costs)
        found.notes += [
            f"group {status.group}: job {name}: {why}; it stays"
            for name, why in skipped.items()
            if name in members
        ]
        for profile in (p for p in profiles if p.name in members):
            why = _stays(profile, settings)
            if why:
                found.notes.append(f"group {status.group}: job {profile.name} {why}; it stays")
                continue
            unique = profile.name
            if names.count(profile.name) > 1:
                unique = f"{status.group}.{profile.name}"
            state = settings.states.get(profile.name, profile.state_gib)
            found.jobs.append(profile.model_copy(update={"name": unique, "state_gib": state}))
            found.home.append(status.group)
    return found


def _stays(profile: JobSpec, settings: LiveSettings) -> str:
    measured = profile.measured
    assert measured is not None
    if len(measured.nodes) != 1:
        return f"spans {len(measured.nodes)} nodes"
    if profile.state_gib is None and profile.name not in settings.states:
        return (
            f"was never checkpointed, so its state is unknown (give --state-gib {profile.name}=GIB)"
        )
    return ""


def advise(
    statuses: Sequence[GroupStatus], histories: Sequence[GroupHistory], settings: LiveSettings
) -> Advice:
    costs = StackCosts()
    live = live_jobs(statuses, histories, settings, costs)
    notes, jobs, home = live.notes, live.jobs, live.home
    if not jobs:
        raise ValueError("no live job could be profiled: " + ("; ".join(notes) or "no jobs"))
    groups = sorted(set(home), key=home.index)
    measured = measured_bandwidth(histories, costs)
    bandwidth = settings.bandwidth_gbps or measured or DEFAULT_BANDWIDTH_GBPS
    if settings.bandwidth_gbps is None:
        notes.append(
            f"bandwidth {bandwidth:.1f} GB/s, as the recorded switches moved their bytes"
            if measured
            else f"bandwidth {bandwidth:g} GB/s assumed: the switches moved too little to "
            "measure it (give --bandwidth-gbps)"
        )
    evaluator = Evaluator(
        PlanInput(
            jobs=jobs,
            gpu_sets=GpuSets(
                count=len(groups),
                gpu_memory_gib=settings.gpu_memory_gib,
                host_memory_gib=settings.host_memory_gib,
                bandwidth_gbps=bandwidth,
                co_residency_margin_gib=settings.co_residency_margin_gib,
            ),
            max_slowdown=settings.max_slowdown,
            policy=StrictPolicy.model_validate(statuses[0].policy.model_dump()),
            costs=costs,
        )
    )
    current = [frozenset(i for i, g in enumerate(home) if g == group) for group in groups]
    best = plan_partition(evaluator, settings.budget_seconds).groups
    if _no_better(evaluator, current, best):
        best = current
    targets = _match(best, current, groups)

    def rows(partition: Sequence[frozenset[int]], labels: Sequence[str]) -> list[Row]:
        return [
            (label, [jobs[i].name for i in sorted(block)], evaluator.busy(block))
            for block, label in zip(partition, labels, strict=True)
        ]

    return Advice(
        jobs=[j.name for j in jobs],
        current=rows(current, groups),
        suggested=rows(best, targets),
        moves=[
            f"move {jobs[i].name}: {home[i]} -> {target}"
            for block, target in zip(best, targets, strict=True)
            for i in sorted(block)
            if home[i] != target
        ],
        freed=[g for g in groups if g not in targets],
        notes=notes,
        current_util=_util(evaluator, current),
        suggested_util=_util(evaluator, best),
        worst_now=max(evaluator.predict(g).worst_slowdown for g in current),
        worst_suggested=max(evaluator.predict(g).worst_slowdown for g in best),
    )


def _util(evaluator: Evaluator, partition: Sequence[frozenset[int]]) -> float:
    return sum(evaluator.busy(g) for g in partition) / len(partition)


def _no_better(
    evaluator: Evaluator, current: Sequence[frozenset[int]], best: Sequence[frozenset[int]]
) -> bool:
    """The live groups are within the limits and the plan neither frees a
    set nor raises utilisation by half a point: suggest nothing."""
    allowed = all(evaluator.allowed(evaluator.predict(g)) for g in current)
    gain = _util(evaluator, best) - _util(evaluator, current)
    return allowed and len(best) == len(current) and gain <= 0.005


def _match(
    best: Sequence[frozenset[int]], current: Sequence[frozenset[int]], groups: Sequence[str]
) -> list[str]:
    """The live group each planned group becomes: the one it shares most jobs
    with, each live group used once."""
    pairs = sorted(
        ((len(b & c), -bi, -ci) for bi, b in enumerate(best) for ci, c in enumerate(current)),
        reverse=True,
    )
    target: dict[int, str] = {}
    used: set[int] = set()
    for _, negative_b, negative_c in pairs:
        b, c = -negative_b, -negative_c
        if b not in target and c not in used:
            target[b] = groups[c]
            used.add(c)
    return [target[b] for b in range(len(best))]


def render_advice(advice: Advice) -> str:
    from timeshare.status import table

    def section(title: str, rows: Sequence[Row]) -> str:
        body = table(["group", "jobs", "busy"], [[g, ", ".join(j), f"{b:.0%}"] for g, j, b in rows])
        return f"{title}\n{body}"

    lines = [
        section(f"now (worst slowdown {advice.worst_now:.2f}x):", advice.current),
        "",
        section(f"suggested (worst slowdown {advice.worst_suggested:.2f}x):", advice.suggested),
        "",
    ]
    if advice.moves:
        lines += [*advice.moves]
        lines += [f"frees the GPU set of group {g}" for g in advice.freed]
        lines.append("nothing was moved: start each job again with the group named above")
    else:
        lines.append("no move raises utilisation or frees a GPU set")
    lines += [f"note: {n}" for n in advice.notes]
    lines.append(advice.line())
    return "\n".join(lines)
