"""What the advisor is told: job profiles, the GPU sets available, the
slowdown each job tolerates, the group policy, and the stack's fixed costs.
The same models read a hand-written YAML file and `timeshare profile --json`."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from timeshare.models import PRIORITY_LIMIT, GroupPolicy, check_phase
from timeshare.names import check_name

GIB = 2**30
# GB/s, as the sim backend's --sim-bandwidth-gbps: 10^9 bytes a second.
GB = 1e9


class Strict(BaseModel):
    # A misspelt field is an error naming it, not a silently ignored default.
    model_config = ConfigDict(extra="forbid")


class Phase(Strict):
    """One phase of an iteration: seconds on the GPU (a turn) or off it."""

    gpu: float | None = Field(default=None, ge=0.0, le=86400.0)
    cpu: float | None = Field(default=None, ge=0.0, le=86400.0)
    # The acquire's phase ("rollout", "train") of a GPU phase, for a group
    # policy's phase_priority.
    phase: str = ""

    @field_validator("phase")
    @classmethod
    def _valid_phase(cls, phase: str) -> str:
        return check_phase(phase)

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if (self.gpu is None) == (self.cpu is None):
            raise ValueError("give exactly one of gpu: SECONDS or cpu: SECONDS")
        if self.phase and self.gpu is None:
            raise ValueError("phase: names what a GPU phase's turn is for; a cpu phase has none")
        return self

    @property
    def on_gpu(self) -> bool:
        return self.gpu is not None

    @property
    def seconds(self) -> float:
        return self.gpu if self.gpu is not None else (self.cpu or 0.0)


class Measured(Strict):
    """What `timeshare profile` saw in a group's history (informative: the
    planner uses the iteration, gpus and state_gib derived from it)."""

    group: str
    turns: int
    # Whole iterations those turns make.
    iterations: int = 0
    turn_seconds_mean: float
    turn_seconds_max: float
    gap_seconds_mean: float
    duty_cycle: float
    # Bytes the job's checkpoint moved off each node (median), where recorded.
    state_bytes_by_node: dict[str, int] = Field(default_factory=dict)
    # Mean seconds of the switches that brought the job in.
    switch_seconds_mean: float = 0.0
    switches_in: int = 0
    nodes: list[str] = Field(default_factory=list)


class JobSpec(Strict):
    name: str
    # GPUs of one set the job needs (all on one node).
    gpus: int = Field(default=1, ge=1, le=64)
    # As the job's Join gives them: fair share counts GPU time over weight;
    # a higher priority goes first (scheduling policies).
    weight: float = Field(default=1.0, gt=0.0, le=1000.0)
    priority: int = Field(default=0, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)
    # Device memory the job holds between its turns, GiB; null from a
    # profile whose job was never checkpointed (unknown, never zero).
    state_gib: float | None = Field(ge=0.0, le=1e6)
    # One RL step, repeated.
    iteration: list[Phase] = Field(min_length=1)
    measured: Measured | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return check_name("job", name)

    @field_validator("iteration")
    @classmethod
    def _some_gpu(cls, phases: list[Phase]) -> list[Phase]:
        if not any(p.on_gpu for p in phases):
            raise ValueError("needs at least one {gpu: SECONDS} phase")
        if sum(p.seconds for p in phases) <= 0:
            raise ValueError("an iteration must take some time")
        return phases

    @property
    def gpu_seconds(self) -> float:
        return sum(p.seconds for p in self.iteration if p.on_gpu)

    @property
    def iteration_seconds(self) -> float:
        """One iteration alone, with no scheduler at all."""
        return sum(p.seconds for p in self.iteration)

    @property
    def duty_cycle(self) -> float:
        return self.gpu_seconds / self.iteration_seconds

    @property
    def turns_per_iteration(self) -> int:
        return sum(1 for p in self.iteration if p.on_gpu)

    @property
    def state_bytes(self) -> int:
        if self.state_gib is None:
            raise ValueError(f"job {self.name!r}: state_gib is unknown")
        return int(self.state_gib * GIB)


class GpuSets(Strict):
    count: int = Field(ge=1, le=100000)
    gpus: int = Field(default=1, ge=1, le=64)
    gpu_memory_gib: float = Field(gt=0.0, le=1e6)
    # Host memory for the parked states of one set's group.
    host_memory_gib: float = Field(ge=0.0, le=1e9)
    # Device<->host GB/s (10^9 bytes a second) per GPU.
    bandwidth_gbps: float = Field(gt=0.0, le=1e6)
    # Device memory co-residency leaves free on each GPU, as the agent's
    # --co-residency-margin-gib (the sim backend keeps none: give 0 there).
    co_residency_margin_gib: float = Field(default=2.0, ge=0.0, le=1e6)
    # Node names of the sets, one each, for the launch settings; default set-1 ...
    nodes: list[str] | None = None

    @field_validator("nodes")
    @classmethod
    def _valid_nodes(cls, nodes: list[str] | None) -> list[str] | None:
        for node in nodes or []:
            check_name("node", node)
        if nodes is not None and len(set(nodes)) != len(nodes):
            raise ValueError("names a node twice")
        return nodes

    @model_validator(mode="after")
    def _one_node_per_set(self) -> Self:
        if self.nodes is not None and len(self.nodes) != self.count:
            raise ValueError(f"nodes: {len(self.nodes)} names for count: {self.count} sets")
        return self

    def node(self, index: int) -> str:
        return self.nodes[index] if self.nodes else f"set-{index + 1}"

    @property
    def bandwidth_bytes_per_second(self) -> float:
        return self.bandwidth_gbps * GB

    @property
    def co_residency_bytes(self) -> int:
        """Device bytes co-resident states may fill: the memory less the margin."""
        return max(0, int((self.gpu_memory_gib - self.co_residency_margin_gib) * GIB))


class StackCosts(Strict):
    """What the real stack adds to the profiles' own seconds: the round trips
    of acquire and yield and a switch's own overhead beyond the bytes moved.
    Defaults: medians measured on the sim stack (docs/benchmarks.md,
    "Placement advisor"); `python -m bench placement` measures them afresh.
    Override them for another deployment."""

    # A job's message (acquire, yield) reaching the scheduler.
    message_seconds: float = Field(default=0.010, ge=0.0, le=60.0)
    # An acquire granted at once (the job still resident, nobody waiting):
    # from the call until the job runs again.
    acquire_seconds: float = Field(default=0.047, ge=0.0, le=60.0)
    # A yield: from the call until the job goes on with its CPU work.
    yield_seconds: float = Field(default=0.047, ge=0.0, le=60.0)
    # A hand-over: from the yield recorded until the switch begins; the
    # switch's own time beyond its transfers; from the switch's end until the
    # waiting job's acquire returns.
    plan_seconds: float = Field(default=0.0, ge=0.0, le=60.0)
    # Each of the job's own phases runs this much longer than its profile
    # says (a loaded host wakes the job late); 0 on a quiet host.
    overrun_seconds: float = Field(default=0.0, ge=0.0, le=60.0)
    switch_seconds: float = Field(default=0.084, ge=0.0, le=60.0)
    grant_seconds: float = Field(default=0.040, ge=0.0, le=60.0)


class StrictPolicy(GroupPolicy):
    """GroupPolicy's fields, a misspelt one refused."""

    model_config = ConfigDict(extra="forbid")


class PlanInput(Strict):
    jobs: list[JobSpec] = Field(min_length=1)
    gpu_sets: GpuSets
    # No job may run slower than this, per iteration, than alone.
    max_slowdown: float = Field(default=1.5, ge=1.0, le=1000.0)
    # Group policy of every planned group (GroupPolicy's fields).
    policy: StrictPolicy = Field(default_factory=StrictPolicy)
    costs: StackCosts = Field(default_factory=StackCosts)

    @model_validator(mode="after")
    def _every_job_known(self) -> Self:
        seen: set[str] = set()
        for index, job in enumerate(self.jobs):
            if job.name in seen:
                raise ValueError(f"jobs[{index}].name: {job.name!r} is named twice")
            seen.add(job.name)
            if job.state_gib is None:
                raise ValueError(
                    f"jobs[{index}].state_gib: unknown for {job.name!r} (its profile saw no "
                    "checkpoint of it); give the GiB it holds on the GPU"
                )
        return self
