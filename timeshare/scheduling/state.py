"""The durable state of one group: what GroupWorkflow keeps and carries across
continue-as-new, in a schema of its own.

The public models (timeshare.models, timeshare.history) are what clients see
and may change with them; the models here are what running workflows hold, so
they change only on purpose, with ``SCHEMA_VERSION``. Where a durable model
has a public counterpart the two have the same fields, and crossing between
them (``public()``, ``stored()``) forbids fields the other side lacks: a
change to one side alone fails loudly in tests instead of silently changing
continue-as-new payloads. Version 1 has the field names and shapes the
scheduler carried before the schema had a number, so recorded histories
still decode.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from timeshare.history import SwitchRecord, TurnRecord
from timeshare.models import Grant, GroupPolicy, NodeMove
from timeshare.scheduling.rules import RULES_LEGACY

SCHEMA_VERSION = 1
# How the group decides (scheduling/rules.py): a running group keeps its
# rules across continue-as-new; an upgrade never changes them under it.
Public = TypeVar("Public", bound=BaseModel)
Stored = TypeVar("Stored", bound="StoredModel")


class StoredModel(BaseModel):
    """A durable model: unknown fields are refused, never dropped."""

    model_config = ConfigDict(extra="forbid")

    def public(self, kind: type[Public]) -> Public:
        return kind.model_validate(self.model_dump())

    @classmethod
    def stored(cls: type[Stored], model: BaseModel) -> Stored:
        return cls.model_validate(model.model_dump())


class StoredPolicy(StoredModel):
    """GroupPolicy as the group keeps it (its checks ran when it was given).
    Where a default differs from GroupPolicy's, it is what a state written
    before the field existed means (LEGACY_DEFAULTS)."""

    lease_seconds: float = 30.0
    # None: as long as lease_seconds (groups from before idle leases).
    idle_lease_seconds: float | None = None
    max_turn_seconds: float = 0.0
    preempt_grace_seconds: float = 10.0
    agent_timeout_seconds: float = 30.0
    continue_as_new_every: int = 0
    co_residency: Literal["auto", "off"] = "auto"
    prefetch: Literal["auto", "off"] = "off"
    gpus: list[int] = Field(default_factory=list)
    ordering: Literal["fair", "fifo"] = "fifo"
    fair_credit_seconds: float = 60.0
    aging_seconds: float = 0.0
    phase_priority: dict[str, int] = Field(default_factory=dict)
    preempt_lower_after_seconds: float = 0.0
    switch_give_up_seconds: float = 120.0
    fair_anticipation_seconds: float = 0.03
    backfill_grace_seconds: float = 10.0
    switch_cost_aware: bool = True
    switch_cost_seconds: float | None = None

    @property
    def idle_lease(self) -> float:
        return self.idle_lease_seconds or self.lease_seconds

    def as_policy(self) -> GroupPolicy:
        fields = self.model_dump()
        fields["idle_lease_seconds"] = self.idle_lease
        return GroupPolicy.model_validate(fields)


# StoredPolicy's defaults that differ from GroupPolicy's, on purpose.
LEGACY_DEFAULTS = {"idle_lease_seconds", "ordering", "prefetch"}


class StoredGrant(StoredModel):
    """One turn, as Grant reports it (with ``told_epoch``, which it derives)."""

    # Public fields this model derives instead of storing.
    DERIVED: ClassVar[frozenset[str]] = frozenset({"told_epoch"})

    job: str
    request_id: str
    epoch: int
    ticket: int
    granted_at: float
    waited_seconds: float
    switch_seconds: float
    resumes_epoch: int = 0
    context_restored: bool = False
    phase: str = ""
    # The holder kept the turn into a next phase (turns.keep_turn) where
    # a next_turn would have let others go first: asked to yield from then.
    kept_past_others_at: float = 0.0

    @property
    def told_epoch(self) -> int:
        """The epoch its job was told: a resumed turn keeps its first epoch."""
        return self.resumes_epoch or self.epoch

    @classmethod
    def of_grant(cls, grant: Grant) -> StoredGrant:
        """The turn a job was told (the scheduler's healer reads it back)."""
        return cls.model_validate(grant.model_dump(exclude=set(cls.DERIVED)))

    def as_grant(self) -> Grant:
        return Grant.model_validate({**self.model_dump(), "told_epoch": self.told_epoch})


class StoredMove(StoredModel):
    """One node's part of a switch, as NodeMove carries it to the agent."""

    node: str
    admit: str
    evict: list[str] = Field(default_factory=list)

    def as_move(self) -> NodeMove:
        return self.public(NodeMove)


class StoredTurn(StoredModel):
    """One turn in the group's bounded history (TurnRecord)."""

    job: str
    epoch: int
    requested_at: float
    granted_at: float
    released_at: float = 0.0
    switch_seconds: float = 0.0
    ended_by: str = ""
    phase: str = ""

    def as_record(self) -> TurnRecord:
        return self.public(TurnRecord)


class StoredSwitch(StoredModel):
    """One node's part of one hand-over in the bounded history (SwitchRecord)."""

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
    checkpoint_bytes: dict[str, int] = Field(default_factory=dict)
    checkpoint_seconds: dict[str, float] = Field(default_factory=dict)
    restore_seconds: float = 0.0

    def as_record(self) -> SwitchRecord:
        return self.public(SwitchRecord)


class JobEntry(StoredModel):
    nodes: list[str]
    token_hash: str
    joined_at: float
    last_seen: float
    turns: int = 0
    waited_seconds: float = 0.0
    held_seconds: float = 0.0
    # Preempted by the turn limit: its turn is suspended and it waits to resume.
    preempted: bool = False
    weight: float = 1.0
    priority: int = 0
    # GPU-seconds used divided by weight: fair ordering serves the least first.
    share_seconds: float = 0.0
    # When the job last yielded, and the phase of that turn (0: it has asked
    # since); how long after a turn of each phase it asked again (a running
    # mean): when it is expected to ask next, for prefetch.
    yielded_at: float = 0.0
    yielded_phase: str = ""
    ask_gaps: dict[str, float] = Field(default_factory=dict)
    # Its state was brought back ahead of its request: its next grant says so.
    restored_ahead: bool = False
    # Runs only while no regular job holds or waits (scheduling/backfill.py).
    backfill: bool = False
    # Which membership this is: a job that leaves and joins again is a new
    # one, so that a release of the old one is told apart (0: from before
    # memberships were counted).
    incarnation: int = 0
    # Smoothed seconds its checkpoint and its restore took, by node: what
    # moving it costs (scheduling/switch_costs.py).
    checkpoint_seconds: dict[str, float] = Field(default_factory=dict)
    restore_seconds: dict[str, float] = Field(default_factory=dict)
    # A backfill job's smoothed seconds from the group asking it to yield to
    # its yield: hearing of it, then the step it was in (switch_costs.py).
    yield_lag_seconds: float = 0.0


class Waiter(StoredModel):
    job: str
    request_id: str
    ticket: int
    since: float
    # W3C trace context of the acquire call, so the switch made for this
    # waiter joins the caller's trace.
    trace_context: dict[str, str] = Field(default_factory=dict)
    # The call that waits for this request now: a withdrawal from an older
    # call (superseded by a retry of the same request) is ignored.
    call_id: str = ""
    # Set for a preempted turn waiting to resume: the epoch the job holds.
    resumes_epoch: int = 0
    phase: str = ""


class SwitchPlan(StoredModel):
    waiter: Waiter
    epoch: int
    moves: list[StoredMove]
    started_at: float
    attempts: int = 0
    # Grows with every plan: an agent refuses a plan older than one it ran.
    number: int = 0
    # Planned by a scheduler whose jobs leave as a whole (quiesce first).
    whole_jobs: bool = False
    # Brings ``waiter.job`` (which has not asked: ticket 0) onto its nodes
    # ahead of its request; nobody is granted when it finishes.
    prefetch: bool = False

    def quiesce_moves(self) -> list[StoredMove]:
        """Where jobs that leave more than one node must first be stopped:
        no rank of theirs is checkpointed before all of them are stopped."""
        if not self.whole_jobs:
            return []
        counts = Counter(job for move in self.moves for job in move.evict)
        spread = {job for job, nodes in counts.items() if nodes > 1}
        return [
            StoredMove(node=move.node, admit="", evict=[j for j in move.evict if j in spread])
            for move in self.moves
            if spread.intersection(move.evict)
        ]


class Anticipation(StoredModel):
    """The turn held open for ``job``, which yielded behind its fair share
    while a job ahead of it waits, until ``until`` (anticipation.anticipate)."""

    job: str
    until: float


class SwitchFailing(StoredModel):
    """A run of failed switch attempts, kept across plans until one succeeds
    or the scheduler gives up (switch_failures.switch_failed)."""

    since: float
    last_at: float = 0.0
    attempts: int = 0
    cause: str = ""
    # The jobs whose state a node could not move off (checkpoint or lock
    # failed), by job: the node and the cause. Evicted when the run is given up.
    stuck: dict[str, str] = Field(default_factory=dict)
    # The stuck jobs were evicted at give-up: the next failure ends the wait.
    stuck_evicted: bool = False


class SwitchAbort(StoredModel):
    """Why a waiter's request was ended by a switch that could not be made:
    what the client's SwitchFailed error carries."""

    # The job whose state could not be moved (the waiter's own for a failed
    # restore), and what the node said.
    job: str
    cause: str


class GroupState(StoredModel):
    """Everything the scheduler knows about a group; carried across continue-as-new."""

    # A field renamed in code keeps its stored name (its alias).
    model_config = ConfigDict(
        extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    # Histories from before the schema had a number decode as version 1.
    schema_version: int = SCHEMA_VERSION
    group: str
    rules: int = RULES_LEGACY
    policy: StoredPolicy = Field(default_factory=StoredPolicy)
    jobs: dict[str, JobEntry] = Field(default_factory=dict)
    queue: list[Waiter] = Field(default_factory=list)
    turn: StoredGrant | None = None
    epoch: int = 0
    next_ticket: int = 1
    resident: dict[str, str] = Field(default_factory=dict)
    switching: SwitchPlan | None = None
    degraded_cause: str = ""
    paused: bool = False
    drained: list[str] = Field(default_factory=list)
    # Why a request or a job was ended by the scheduler (eviction, lease, failed restore).
    aborted_requests: dict[str, str] = Field(default_factory=dict)
    evicted_jobs: dict[str, str] = Field(default_factory=dict)
    # The epoch each job last yielded, so a retried yield is answered again,
    # and the request that turn served, so a late duplicate is not queued again.
    # Stored as "released", its name before "release" came to mean only
    # letting a departed job's processes go (docs/architecture.md, "Words").
    yielded: dict[str, int] = Field(default_factory=dict, alias="released")
    served_requests: dict[str, str] = Field(default_factory=dict)
    # The call that was told (or is about to be told) of the current turn.
    turn_call_id: str = ""
    plans: int = 0
    grants: int = 0
    switches: int = 0
    switch_seconds_total: float = 0.0
    preemptions: int = 0
    evictions: int = 0
    # Backfill jobs' GPU time, their preemptions, and the seconds regular
    # jobs waited while a backfill job held the turn (all since the group began).
    backfill_busy_seconds: float = 0.0
    backfill_preemptions: int = 0
    backfill_delay_seconds: float = 0.0
    # How many times the workflow has continued as new with this state.
    runs: int = 1
    # How often, and when lately, the group was rebuilt after its workflow
    # task kept failing (scheduling/healing.py).
    heals: int = 0
    heal_times: list[float] = Field(default_factory=list)
    # When the turn, a switch or an outage last began or ended.
    since: float = 0.0
    # Recent turns and per-node switches, bounded, for `timeshare report`.
    recent_turns: list[StoredTurn] = Field(default_factory=list)
    recent_switches: list[StoredSwitch] = Field(default_factory=list)
    # Jobs that left the group (leave, eviction, lease, exit), and the nodes
    # whose agents have yet to release their processes.
    releasing: dict[str, list[str]] = Field(default_factory=dict)
    # The incarnation (JobEntry.incarnation) whose release each of those is.
    releasing_incarnation: dict[str, int] = Field(default_factory=dict)
    # Memberships begun in the group so far: the last one's incarnation.
    incarnations: int = 0
    # The turn held open for a yielder behind its fair share (None: none).
    anticipation: Anticipation | None = None
    # Failed switch attempts since the last switch that worked (None: none).
    failing: SwitchFailing | None = None
    # Requests ended by a switch that could not be made, by request id.
    switch_aborts: dict[str, SwitchAbort] = Field(default_factory=dict)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value > SCHEMA_VERSION:
            raise ValueError(
                f"group state schema {value} is newer than this scheduler's "
                f"({SCHEMA_VERSION}): upgrade the scheduler before running it on this group"
            )
        return value
