"""A group's recent history, kept bounded in the group workflow and carried
across continue-as-new: what `timeshare report` draws as a timeline."""

from __future__ import annotations

from pydantic import BaseModel, Field

# Enough for hours of a busy group while keeping the workflow state (which is
# carried in every continue-as-new input) well under Temporal's payload limits.
HISTORY_TURNS = 500
HISTORY_SWITCHES = 1000


class TurnRecord(BaseModel):
    """One turn of one job: it asked at `requested_at`, got the GPUs at
    `granted_at` (after `switch_seconds` of switching) and gave them back at
    `released_at` (0 while it still holds them)."""

    job: str
    epoch: int
    requested_at: float
    granted_at: float
    released_at: float = 0.0
    switch_seconds: float = 0.0
    # Why the turn ended if not by the job's own yield: "preempted", "evicted", "left".
    ended_by: str = ""
    # What the job said it would do with the turn.
    phase: str = ""


class SwitchRecord(BaseModel):
    """One node's part of one hand-over: `evicted` left the node's GPUs,
    `admitted` came back, between `started_at` and `finished_at`."""

    node: str
    epoch: int
    started_at: float
    finished_at: float
    evicted: list[str] = Field(default_factory=list)
    admitted: str = ""
    bytes_moved: int = 0
    backend: str = ""
    ok: bool = True
    error: str = ""
    # Bytes each job's checkpoint moved off the node (locked jobs moved none).
    checkpoint_bytes: dict[str, int] = Field(default_factory=dict)
    # Seconds each job's checkpoint took, and the admitted job's restore.
    checkpoint_seconds: dict[str, float] = Field(default_factory=dict)
    restore_seconds: float = 0.0


class GroupHistory(BaseModel):
    group: str
    # Wall-clock seconds (Unix time) when the history was read.
    captured_at: float
    turns: list[TurnRecord] = Field(default_factory=list)
    switches: list[SwitchRecord] = Field(default_factory=list)
