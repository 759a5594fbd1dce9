"""Figures of the GPU check, from the node agent's own record (BackendConfig
.record_path: one line per CUDA rank and action, with its bytes as NVML showed
them, its seconds, and when its call began and ended) and from the offload
hook's timings, and the limits they are judged against:

- transparent path: each rank's checkpoint and restore rate through timeshare
  at least 90 % of the raw driver calls on the same bytes (``driver_ratio``);
- hooks path: the offload hook at least 50 % of a pinned copy of the same
  bytes measured in the same run;
- ranks of one job move at once: ``overlap`` is, for each phase (one job's
  checkpoint or restore on a node), how much of the other ranks' time fell
  while another rank was moving too, 1 when all ran at once, 0 when one
  after another.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

DRIVER_RATIO_LIMIT = 0.90
HOOKS_CEILING_LIMIT = 0.50
MOVES = ("checkpoint", "restore")


class RankMove(BaseModel):
    """One rank's checkpoint or restore, as the agent recorded it."""

    event: str
    job: str
    pid: int
    bytes: int
    seconds: float
    start: float | None = None
    end: float | None = None

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9


def rank_moves(record: Sequence[dict[str, Any]], group: str) -> list[RankMove]:
    """The group's rank checkpoints and restores that moved known bytes."""
    return [
        RankMove.model_validate(event)
        for event in record
        if event.get("group") == group
        and event.get("event") in MOVES
        and event.get("bytes")
        and event.get("seconds")
    ]


def phases(moves: Sequence[RankMove]) -> list[list[RankMove]]:
    """Each job's checkpoint or restore on the node: the agent writes one
    phase's ranks together, so a phase is a run of one job's one event."""
    found: list[list[RankMove]] = []
    for move in moves:
        if (
            found
            and (found[-1][0].job, found[-1][0].event) == (move.job, move.event)
            and (move.pid not in {m.pid for m in found[-1]})
        ):
            found[-1].append(move)
        else:
            found.append([move])
    return found


def overlap(phase: Sequence[RankMove]) -> float | None:
    """1 when every rank's call ran while the longest did, 0 when they ran
    one after another; None for one rank or a record without timestamps."""
    spans = [(m.start, m.end) for m in phase if m.start is not None and m.end is not None]
    if len(spans) < 2 or len(spans) != len(phase):
        return None
    durations = [end - start for start, end in spans]
    union, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        union += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    spare = sum(durations) - max(durations)
    return 1.0 if spare <= 0 else max(0.0, min(1.0, (sum(durations) - union) / spare))


def overlaps(moves: Sequence[RankMove]) -> list[float]:
    return [o for phase in phases(moves) if (o := overlap(phase)) is not None]


def p50(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def ratio(measured: float | None, reference: float | None) -> float | None:
    if measured is None or not reference:
        return None
    return measured / reference


def figure(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
