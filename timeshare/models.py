"""Pydantic models that cross a process boundary: workflow and activity
arguments and results, and the status shown to users.

Each workflow message and activity takes exactly one of these, so fields can
be added later without breaking running workflow histories.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

GroupStateName = Literal["idle", "held", "switching", "degraded"]


class JoinInput(BaseModel):
    job: str
    nodes: list[str]
    token_hash: str


class JoinOutput(BaseModel):
    created: bool
    nodes: list[str]


class AcquireInput(BaseModel):
    job: str
    token_hash: str
    request_id: str
    # 0 waits until granted.
    timeout_seconds: float = 0.0


class Grant(BaseModel):
    """One turn: what an acquire returns."""

    job: str
    request_id: str
    epoch: int
    ticket: int
    granted_at: float
    waited_seconds: float
    switch_seconds: float


class YieldInput(BaseModel):
    job: str
    token_hash: str
    epoch: int


class YieldOutput(BaseModel):
    held_seconds: float


class JobInput(BaseModel):
    """A message that names only the job (heartbeat, leave)."""

    job: str
    token_hash: str


class HeartbeatOutput(BaseModel):
    holding: bool
    epoch: int
    waiting: int
    should_yield: bool = False


class JobStatus(BaseModel):
    job: str
    nodes: list[str]
    turns: int
    waited_seconds: float
    held_seconds: float


class GroupStatus(BaseModel):
    group: str
    state: GroupStateName
    holder: str = ""
    epoch: int = 0
    queue: list[str] = Field(default_factory=list)
    jobs: list[JobStatus] = Field(default_factory=list)
    resident: dict[str, str] = Field(default_factory=dict)
    switches: int = 0
    grants: int = 0
    switch_seconds_total: float = 0.0
    degraded_cause: str = ""


class NodeMove(BaseModel):
    """What one node must do for a switch: evict these jobs, then admit one."""

    node: str
    admit: str
    evict: list[str] = Field(default_factory=list)


class SwitchInput(BaseModel):
    group: str
    epoch: int
    move: NodeMove


class BackendAction(BaseModel):
    job: str
    action: Literal["checkpoint", "restore", "noop"]
    bytes: int = 0
    seconds: float = 0.0


class SwitchOutput(BaseModel):
    node: str
    backend: str
    actions: list[BackendAction] = Field(default_factory=list)
    seconds: float = 0.0


class NodeInfo(BaseModel):
    node: str
    backend: str
    simulated: bool
    gpus: list[str] = Field(default_factory=list)


class NodeRecord(NodeInfo):
    alive: bool = True
    last_seen: float = 0.0
