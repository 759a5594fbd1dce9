"""Job profiles from a group's recorded history: what each member's turns
and the gaps between them say about its iteration, and what its checkpoints
say about its state.

The history holds the scheduler's clock: a turn runs from its grant to its
yield being recorded, so it includes the job's own acquire return and yield
message; a gap runs from one yield recorded to the next acquire arriving, so
it includes the yield's return. Those round trips (StackCosts) are taken
off again, so that a profile run through the model gives back the history
it came from.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Sequence

from timeshare.history import GroupHistory, TurnRecord
from timeshare.models import GroupStatus
from timeshare.placement.spec import GIB, JobSpec, Measured, Phase, StackCosts

# An iteration repeats its turns and gaps with at most this many turns.
MAX_TURNS_PER_ITERATION = 8
# Positions of one iteration must agree this well (share of the variance
# left), or come this near the best period's fit.
PERIOD_FIT = 0.05
NEAR_BEST = 2.0
# A gap shorter than this is no CPU phase: the job asked again at once (the
# stack's own round trips vary by about this much on a loaded host).
MIN_CPU_SECONDS = 0.05
MIN_TURNS = 3


class ProfileError(ValueError):
    pass


def profile_group(
    status: GroupStatus, history: GroupHistory, costs: StackCosts | None = None
) -> tuple[list[JobSpec], dict[str, str]]:
    """Profiles of the group's jobs, members now or seen in its history (a
    finished run profiles too), and why each job that has none has none. A
    member's weight and priority are as it joined; each GPU phase is named
    as the job's acquires named it most often."""
    costs = costs or StackCosts()
    members = {job.job: job for job in status.jobs}
    nodes = {job.job: job.nodes for job in status.jobs}
    for turn in history.turns:
        nodes.setdefault(turn.job, _nodes_seen(turn.job, history))
    profiles: list[JobSpec] = []
    skipped: dict[str, str] = {}
    for name, where in nodes.items():
        try:
            found = profile_job(name, where, history, costs)
            member = members.get(name)
            if member is not None:
                found = found.model_copy(
                    update={"weight": member.weight, "priority": member.priority}
                )
            profiles.append(found)
        except ProfileError as why:
            skipped[name] = str(why)
    return profiles, skipped


def _nodes_seen(job: str, history: GroupHistory) -> list[str]:
    return sorted({s.node for s in history.switches if s.admitted == job})


def profile_job(name: str, nodes: list[str], history: GroupHistory, costs: StackCosts) -> JobSpec:
    turns = sorted(
        (t for t in history.turns if t.job == name and t.released_at and not t.ended_by),
        key=lambda t: t.epoch,
    )
    if len(turns) < MIN_TURNS:
        raise ProfileError(
            f"{len(turns)} whole turns in the group's history, at least {MIN_TURNS} needed; "
            "profile it after it has run longer"
        )
    work = [_work_seconds(t, costs) for t in turns]
    gaps = [
        max(0.0, after.requested_at - before.released_at - costs.yield_seconds)
        for before, after in itertools.pairwise(turns)
    ]
    # The last turn's gap is unknown: take the one a period before it.
    period = _period(work, gaps)
    gaps.append(gaps[-period] if len(gaps) >= period else 0.0)
    iteration: list[Phase] = []
    for position in range(period):
        named = Counter(t.phase for t in turns[position::period]).most_common(1)[0][0]
        iteration.append(Phase(gpu=statistics.median(work[position::period]), phase=named))
        cpu = statistics.median(gaps[position::period])
        if cpu >= MIN_CPU_SECONDS:
            iteration.append(Phase(cpu=cpu))
    state_by_node = _state_bytes(name, history)
    switched = [t.switch_seconds for t in turns if t.switch_seconds > 0]
    gpu = sum(p.seconds for p in iteration if p.on_gpu)
    measured = Measured(
        group=history.group,
        turns=len(turns),
        iterations=len(turns) // period,
        turn_seconds_mean=statistics.fmean(t.released_at - t.granted_at for t in turns),
        turn_seconds_max=max(t.released_at - t.granted_at for t in turns),
        gap_seconds_mean=statistics.fmean(gaps),
        duty_cycle=gpu / sum(p.seconds for p in iteration),
        state_bytes_by_node=state_by_node,
        switch_seconds_mean=statistics.fmean(switched) if switched else 0.0,
        switches_in=len(switched),
        nodes=list(nodes),
    )
    # The job's state on its nodes together; unknown (None) when never checkpointed.
    state = sum(state_by_node.values()) / GIB if state_by_node else None
    return JobSpec(name=name, gpus=1, state_gib=state, iteration=iteration, measured=measured)


def _work_seconds(turn: TurnRecord, costs: StackCosts) -> float:
    """The job's own GPU seconds in a turn: less its acquire's return and its
    yield's message."""
    returned = costs.grant_seconds if turn.switch_seconds > 0 else (
        costs.acquire_seconds - costs.message_seconds
    )  # fmt: skip
    return max(0.0, turn.released_at - turn.granted_at - returned - costs.message_seconds)


def _period(work: Sequence[float], gaps: Sequence[float]) -> int:
    """The fewest turns per iteration whose positions repeat: each position's
    turns and gaps agree, leaving little of the variance unexplained. A
    multiple of the true period always explains a little more (it has more
    positions to fit the noise with), so the smallest period that comes near
    the best wins."""
    series = [list(work[: len(gaps)]), list(gaps)]
    total = sum(_spread(values) for values in series)
    if total <= 1e-12:
        return 1
    left = {
        period: sum(
            _spread(values[position::period])
            for values in series
            for position in range(period)
        ) / total
        for period in range(1, min(MAX_TURNS_PER_ITERATION, len(gaps) // 2) + 1)
    }  # fmt: skip
    if not left:
        return 1
    near = max(PERIOD_FIT, NEAR_BEST * min(left.values()))
    return min(period for period, share in left.items() if share <= near)


def _spread(values: Sequence[float]) -> float:
    """Sum of squared deviations from the mean."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return sum((v - mean) ** 2 for v in values)


def _state_bytes(job: str, history: GroupHistory) -> dict[str, int]:
    """Median bytes the job's checkpoints moved off each node."""
    moved: dict[str, list[int]] = {}
    for switch in history.switches:
        count = switch.checkpoint_bytes.get(job)
        if switch.ok and count:
            moved.setdefault(switch.node, []).append(count)
    return {node: int(statistics.median(counts)) for node, counts in sorted(moved.items())}
