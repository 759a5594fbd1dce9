"""What a group's history says, ready to draw: lanes of segments per job and
per node, utilisation in buckets, and the summary figures. Both renderers
(HTML and PNG) draw exactly this, so they cannot disagree."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from timeshare.history import GroupHistory, SwitchRecord, TurnRecord

UTILISATION_BUCKETS = 48

# Segment kinds. A job lane holds wait/switch/turn; a node lane holds the rest.
WAIT = "wait"
SWITCH = "switch"
TURN = "turn"
RESIDENT = "resident"
SWITCHING = "switching"
FAILED = "failed"
EMPTY = "empty"
UNKNOWN = "unknown"

# Shared by both renderers so a job has one colour in the PNG and the HTML.
JOB_COLOURS = (
    "#3b6fb6",
    "#d9822b",
    "#3f9a5b",
    "#b8465a",
    "#7d5ba6",
    "#8c6d46",
    "#cc6fb0",
    "#6f7a84",
    "#a8a83a",
    "#2fa3b5",
)
KIND_COLOURS = {
    WAIT: "#d7dbe0",
    SWITCH: "#f2b134",
    SWITCHING: "#f2b134",
    FAILED: "#d62828",
    EMPTY: "#f4f5f7",
    UNKNOWN: "#a9adb3",
}


@dataclass(frozen=True)
class Segment:
    """[start, end) in seconds since the timeline's origin."""

    start: float
    end: float
    kind: str
    # The job whose colour it takes (turns and residency); "" for the neutral kinds.
    job: str
    title: str


@dataclass
class Lane:
    name: str
    kind: str  # "job" or "node"
    segments: list[Segment] = field(default_factory=list)


@dataclass(frozen=True)
class Bucket:
    start: float
    end: float
    busy: float  # fraction of the bucket in which a job held the GPUs and no switch ran


class JobSummary(BaseModel):
    job: str
    turns: int
    # From asking to holding, switch time included: what the job experienced.
    wait_seconds: float
    held_seconds: float
    switch_seconds: float
    still_holding: bool


class ReportSummary(BaseModel):
    group: str
    captured_at: float
    span_seconds: float
    jobs: list[JobSummary]
    switches: int
    failed_switches: int
    switch_seconds: float
    bytes_moved: int
    utilisation: float


@dataclass
class Timeline:
    group: str
    origin: float
    span: float
    jobs: list[Lane]
    nodes: list[Lane]
    buckets: list[Bucket]
    summary: ReportSummary

    def colour(self, job: str) -> str:
        names = [lane.name for lane in self.jobs]
        index = names.index(job) if job in names else len(names)
        return JOB_COLOURS[index % len(JOB_COLOURS)]


def _turn_end(turn: TurnRecord, captured_at: float) -> float:
    return max(turn.granted_at, turn.released_at or captured_at)


def _bounds(history: GroupHistory) -> tuple[float, float]:
    starts = [t.requested_at for t in history.turns] + [s.started_at for s in history.switches]
    if not starts:
        return history.captured_at, history.captured_at
    ends = [history.captured_at]
    ends += [_turn_end(t, history.captured_at) for t in history.turns]
    ends += [s.finished_at for s in history.switches]
    origin = min(starts)
    return origin, max(ends)


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _subtract(
    keep: Sequence[tuple[float, float]], remove: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Both sorted and disjoint (as from _union)."""
    result: list[tuple[float, float]] = []
    for start, end in keep:
        cursor = start
        for cut_start, cut_end in remove:
            if cut_end <= cursor or cut_start >= end:
                continue
            if cut_start > cursor:
                result.append((cursor, cut_start))
            cursor = max(cursor, cut_end)
        if cursor < end:
            result.append((cursor, end))
    return result


def _covered(intervals: Sequence[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in intervals)


def busy_intervals(history: GroupHistory) -> list[tuple[float, float]]:
    """Absolute times in which some job held the GPUs and no node was switching."""
    held = _union((t.granted_at, _turn_end(t, history.captured_at)) for t in history.turns)
    switching = _union((s.started_at, s.finished_at) for s in history.switches)
    return _subtract(held, switching)


def summarise(history: GroupHistory) -> ReportSummary:
    origin, end = _bounds(history)
    span = end - origin
    jobs: dict[str, JobSummary] = {}
    for turn in sorted(history.turns, key=lambda t: t.requested_at):
        job = jobs.setdefault(
            turn.job,
            JobSummary(
                job=turn.job,
                turns=0,
                wait_seconds=0.0,
                held_seconds=0.0,
                switch_seconds=0.0,
                still_holding=False,
            ),
        )
        job.turns += 1
        job.wait_seconds += max(0.0, turn.granted_at - turn.requested_at)
        job.held_seconds += _turn_end(turn, history.captured_at) - turn.granted_at
        job.switch_seconds += turn.switch_seconds
        job.still_holding = job.still_holding or not turn.released_at
    busy = sum(b - a for a, b in busy_intervals(history))
    return ReportSummary(
        group=history.group,
        captured_at=history.captured_at,
        span_seconds=span,
        jobs=list(jobs.values()),
        switches=len(history.switches),
        failed_switches=sum(1 for s in history.switches if not s.ok),
        switch_seconds=sum(max(0.0, s.finished_at - s.started_at) for s in history.switches),
        bytes_moved=sum(s.bytes_moved for s in history.switches),
        utilisation=busy / span if span > 0 else 0.0,
    )


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def summary_line(summary: ReportSummary) -> str:
    failed = f" ({summary.failed_switches} failed)" if summary.failed_switches else ""
    return (
        f"{len(summary.jobs)} jobs, {sum(j.turns for j in summary.jobs)} turns over "
        f"{summary.span_seconds:.1f} s; {summary.switches} switches in all{failed}, those "
        f"done ahead of a request included, moved {human_bytes(summary.bytes_moved)}; "
        f"GPUs held by a job {summary.utilisation:.0%} of the time"
    )


def _outcome(turn: TurnRecord) -> str:
    if not turn.released_at:
        return "still held when captured"
    return f"ended: {turn.ended_by}" if turn.ended_by else "yielded"


def _job_lane(name: str, turns: list[TurnRecord], origin: float, captured_at: float) -> Lane:
    lane = Lane(name, "job")
    for turn in turns:
        granted = turn.granted_at - origin
        # The switch ran just before the grant; a record claiming more switch than
        # wait is drawn as all switch rather than reaching back before the request.
        switch_start = max(turn.requested_at - origin, granted - turn.switch_seconds)
        waited = turn.granted_at - turn.requested_at
        if switch_start > turn.requested_at - origin:
            lane.segments.append(
                Segment(
                    turn.requested_at - origin,
                    switch_start,
                    WAIT,
                    "",
                    f"{name} waits for turn {turn.epoch} ({waited:.3f} s with the switch)",
                )
            )
        if granted > switch_start:
            lane.segments.append(
                Segment(
                    switch_start,
                    granted,
                    SWITCH,
                    "",
                    f"switch to {name} for turn {turn.epoch}: {turn.switch_seconds:.3f} s",
                )
            )
        end = _turn_end(turn, captured_at) - origin
        phase = f" ({turn.phase})" if turn.phase else ""
        held = f"{name} turn {turn.epoch}{phase}: {end - granted:.3f} s, {_outcome(turn)}"
        lane.segments.append(Segment(granted, end, TURN, name, held))
    return lane


def _switch_title(switch: SwitchRecord) -> str:
    evicted = ", ".join(switch.evicted) or "nothing"
    admitted = switch.admitted or "nothing"
    took = switch.finished_at - switch.started_at
    what = f"{switch.node} epoch {switch.epoch}: {evicted} out, {admitted} in, {took:.3f} s"
    details = f"{human_bytes(switch.bytes_moved)}" + (
        f", {switch.backend}" if switch.backend else ""
    )
    timed = [f"{job} checkpoint {s:.3f} s" for job, s in sorted(switch.checkpoint_seconds.items())]
    if switch.restore_seconds:
        timed.append(f"{admitted} restore {switch.restore_seconds:.3f} s")
    details += "".join(f", {part}" for part in timed)
    if switch.ok:
        return f"{what} ({details})"
    return f"FAILED {what} ({details}): {switch.error or 'no cause recorded'}"


def _node_lane(name: str, switches: list[SwitchRecord], origin: float, end: float) -> Lane:
    lane = Lane(name, "node")
    ordered = sorted(switches, key=lambda s: (s.started_at, s.finished_at))
    for index, switch in enumerate(ordered):
        start = switch.started_at - origin
        finished = max(start, switch.finished_at - origin)
        kind = SWITCHING if switch.ok else FAILED
        lane.segments.append(Segment(start, finished, kind, "", _switch_title(switch)))
        following = ordered[index + 1].started_at - origin if index + 1 < len(ordered) else end
        until = max(finished, following)
        if until <= finished:
            continue
        if not switch.ok:
            # A failed switch may have moved part of the state: claim nothing until
            # a later switch says what is there.
            lane.segments.append(
                Segment(finished, until, UNKNOWN, "", f"{name}: residency unknown after failure")
            )
        elif switch.admitted:
            lane.segments.append(
                Segment(
                    finished,
                    until,
                    RESIDENT,
                    switch.admitted,
                    f"{switch.admitted} resident on {name} for {until - finished:.3f} s",
                )
            )
        else:
            lane.segments.append(Segment(finished, until, EMPTY, "", f"{name}: no job resident"))
    return lane


def _buckets(
    busy: Sequence[tuple[float, float]], origin: float, span: float, count: int
) -> list[Bucket]:
    if span <= 0:
        return []
    width = span / count
    buckets = []
    for index in range(count):
        start = origin + index * width
        busy_seconds = _covered(busy, start, start + width)
        buckets.append(Bucket(index * width, (index + 1) * width, busy_seconds / width))
    return buckets


def build_timeline(history: GroupHistory, buckets: int = UTILISATION_BUCKETS) -> Timeline:
    origin, end = _bounds(history)
    span = end - origin
    by_job: dict[str, list[TurnRecord]] = {}
    for turn in sorted(history.turns, key=lambda t: (t.requested_at, t.epoch)):
        by_job.setdefault(turn.job, []).append(turn)
    by_node: dict[str, list[SwitchRecord]] = {}
    for switch in history.switches:
        by_node.setdefault(switch.node, []).append(switch)
    # A job that only ever appears as resident (its turns aged out of the bounded
    # history) still gets a lane, so every colour on a node lane has a name.
    for switch in sorted(history.switches, key=lambda s: s.started_at):
        if switch.admitted:
            by_job.setdefault(switch.admitted, [])
    return Timeline(
        group=history.group,
        origin=origin,
        span=span,
        jobs=[_job_lane(job, turns, origin, history.captured_at) for job, turns in by_job.items()],
        nodes=[_node_lane(node, by_node[node], origin, span) for node in sorted(by_node)],
        buckets=_buckets(busy_intervals(history), origin, span, buckets),
        summary=summarise(history),
    )
