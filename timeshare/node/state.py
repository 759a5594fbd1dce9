"""What a node's agent knows, in one serialisable record: NodeCore decides
from it and changes it, and nothing else does.

After a restart the agent rebuilds it (``NodeState.restarted``) from the
record it last saved beside its socket: the durable part, which changes only
when a job leaves, joins again or comes back (which memberships were
released here, the incarnations seen, the jobs parked here that left, the
GPUs each group claims). The rest is relearned from what follows: the
scheduler's next switch names the plan, the admitted job and its members'
incarnations again, and the backend says what is on the device.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from timeshare.node.commands import Step

Key = str  # "group/job": names hold no "/" (timeshare.names)


def key_of(group: str, job: str) -> Key:
    return f"{group}/{job}"


def split_key(key: Key) -> tuple[str, str]:
    group, job = key.split("/", 1)
    return group, job


class SwitchHere(BaseModel):
    """The group's switch under way here: the steps still to take, in
    order, and what its answer will say."""

    model_config = ConfigDict(extra="forbid")

    admit: str
    others: list[str] = Field(default_factory=list)
    kept: list[str] = Field(default_factory=list)
    evicted: list[str] = Field(default_factory=list)
    # (job, step) still to take; the first is the one under way.
    steps: list[tuple[str, Step]] = Field(default_factory=list)
    quiesce: bool = False


class GroupHere(BaseModel):
    """One group, as this node sees it."""

    model_config = ConfigDict(extra="forbid")

    # The job its last switch here admitted ("" none): a process of any other
    # job of the group that registers meanwhile leaves the device at once.
    admitted: str = ""
    # The last switch plan that ran here: an older one is refused.
    latest_plan: int = 0
    # Whether its last switch here kept jobs co-resident.
    co_residency: bool = False
    # The GPUs its policy claims here (none: all of the node's).
    gpus: list[int] = Field(default_factory=list)
    # Jobs that left while another held the device with co-residency off:
    # their state waits in host memory for the GPUs to be free.
    parked_leavers: list[str] = Field(default_factory=list)
    # Its switch under way here (None: none).
    switch: SwitchHere | None = None


class JobHere(BaseModel):
    """One job of a group, as this node sees it."""

    model_config = ConfigDict(extra="forbid")

    # When it last ran here (the node's clock): the least recently run leaves first.
    last_ran: int = 0
    # The latest membership (incarnation) a switch here named, and the one
    # whose release last ran here: a late release must not let go of the
    # processes of the membership that is back.
    member_incarnation: int = 0
    released_incarnation: int = 0
    # Its processes were let go (it left its group): never stopped again
    # here until it is a member again (admitted, named by a switch, or a
    # new process of it registers).
    released: bool = False


class NodeState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: str
    # Grows with every admission here (JobHere.last_ran).
    clock: int = 0
    groups: dict[str, GroupHere] = Field(default_factory=dict)
    jobs: dict[Key, JobHere] = Field(default_factory=dict)
    # Host bytes held for each checkpoint under way, whatever its group.
    host_held: dict[Key, int] = Field(default_factory=dict)

    def group(self, group: str) -> GroupHere:
        return self.groups.setdefault(group, GroupHere())

    def job(self, group: str, job: str) -> JobHere:
        return self.jobs.setdefault(key_of(group, job), JobHere())

    def released(self, group: str, job: str) -> bool:
        entry = self.jobs.get(key_of(group, job))
        return entry is not None and entry.released

    def durable(self, group: str | None = None) -> NodeState:
        """What a restart keeps: all but what the next switch and the backend
        tell again (admissions, plans, co-residency, run order, holds of
        checkpoints that a restart ended). ``group``: of that group alone."""
        groups = [(n, g) for n, g in self.groups.items() if group in (None, n)]
        prefix = "" if group is None else key_of(group, "")
        jobs = [(key, job) for key, job in self.jobs.items() if key.startswith(prefix)]
        return NodeState(
            node=self.node,
            groups={
                name: GroupHere(gpus=here.gpus, parked_leavers=here.parked_leavers)
                for name, here in groups
                if here.gpus or here.parked_leavers
            },
            jobs={
                key: JobHere(
                    member_incarnation=job.member_incarnation,
                    released_incarnation=job.released_incarnation,
                    released=job.released,
                )
                for key, job in jobs
                if job.released or job.member_incarnation or job.released_incarnation
            },
        )

    @classmethod
    def restarted(
        cls,
        node: str,
        saved: NodeState | None,
        released_before: frozenset[tuple[str, str]] = frozenset(),
    ) -> NodeState:
        """The record an agent starts from: the durable part of the one it
        saved, and the jobs a registrations file from before this record
        marks released."""
        state = saved.durable() if saved is not None and saved.node == node else cls(node=node)
        for group, job in sorted(released_before):
            state.job(group, job).released = True
        return state
