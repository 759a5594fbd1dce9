"""A node's core under random traffic, through its one door: a Hypothesis
state machine hands NodeCore.handle the scheduler's switches (admitting a
job, moving one out, stopping jobs before a checkpoint, plans that arrive
late), releases of jobs that left (some after the job joined again),
rejoins, processes that register or exit, NVML that cannot tell a job's
size, failing backend steps, another group's checkpoints holding host
memory, and agent restarts (the core rebuilt from the record it last
saved). It carries out the core's commands as the agent's executor
(activities/switch.py) does, against a simulated GPU and host that the
machine keeps itself: the invariants are checked against what they hold,
not against the core's own belief.

Kept in tests/ rather than in its test module, so that
tests/unit/test_node_machine.py can also run it on cores broken on purpose
and see it fail."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, assert_never

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from timeshare.models import BackendAction, NodeMove, SwitchInput, SwitchPhase
from timeshare.node import commands as cmd
from timeshare.node import events as ev
from timeshare.node.core import NodeCore
from timeshare.node.state import NodeState

NODE, GROUP, OTHER_GROUP = "n", "g", "g2"
JOBS = ("a", "b", "c")
# One GPU of this many units, and a host of this many.
CAPACITY = 10
HOST = 14
FOOTPRINTS = {"a": 3, "b": 4, "c": 6}
Where = Literal["none", "running", "locked", "host"]
ON_DEVICE = ("running", "locked")
STEPS: list[cmd.Step] = ["lock", "checkpoint", "restore", "quiesce"]
# The backend's exception classes a step can fail with.
FAILURES = ["BackendError", "JobFailed", "HookFailed", "NoDeviceRoom"]
CoResidency = Literal["auto", "off"]


@dataclass
class Truth:
    """What the simulated node really holds: each job's state, where."""

    where: dict[str, Where] = field(default_factory=lambda: dict.fromkeys(JOBS, "none"))
    # Jobs whose size NVML cannot tell.
    unknown: set[str] = field(default_factory=set)
    # Host units another group's checkpoint under way holds.
    other_checkpoint: int = 0

    def on_device(self) -> list[str]:
        return [job for job in JOBS if self.where[job] in ON_DEVICE]

    def running(self) -> list[str]:
        return [job for job in JOBS if self.where[job] == "running"]

    def used(self) -> int:
        return sum(FOOTPRINTS[job] for job in self.on_device())

    def parked(self) -> int:
        return sum(FOOTPRINTS[job] for job in JOBS if self.where[job] == "host")

    def device_bytes(self, job: str) -> dict[str, int] | None:
        if job in self.unknown:
            return None
        return {"gpu0": FOOTPRINTS[job]} if self.where[job] in ON_DEVICE else {}


class NodeMachine(RuleBasedStateMachine):
    # The core under test (tests plant broken ones here).
    core_kind: type[NodeCore] = NodeCore

    def __init__(self) -> None:
        super().__init__()
        self.core = self.core_kind(NodeState(node=NODE))
        self.truth = Truth()
        self.co_residency: CoResidency = "auto"
        # The scheduler's side: each job's membership (incarnation), whether
        # it is a member now, and the releases it has yet to deliver.
        self.incarnation = dict.fromkeys(JOBS, 0)
        self.member = dict.fromkeys(JOBS, False)
        self.pending: list[tuple[str, int]] = []
        self.plan = 0
        # Of each job, the latest membership a switch told the agent of, and
        # the membership of the latest release it carried out.
        self.told = dict.fromkeys(JOBS, 0)
        self.released = dict.fromkeys(JOBS, 0)
        # Jobs whose processes were let go and that are no member since:
        # nothing stops them again (a switch keeps them running, a newcomer
        # of theirs is left alone).
        self.let_go: set[str] = set()
        # The record as last saved (Persist), for a restart.
        self.saved: NodeState | None = None
        # The next step of this kind fails with this error.
        self.fail_next: tuple[str, str] | None = None
        self.answers: list[cmd.Command] = []

    @initialize(
        co_residency=st.sampled_from(["auto", "off"]), members=st.sets(st.sampled_from(JOBS))
    )
    def create(self, co_residency: CoResidency, members: set[str]) -> None:
        self.co_residency = co_residency
        for job in sorted(members):
            self.join(job)

    # -- carrying out what the core says, as the agent's executor does --------------

    def carry_out(self, commands: list[cmd.Command]) -> None:
        """In order, the core's answer to each event next (the executor's loop)."""
        work = list(commands)
        while work:
            command = work.pop(0)
            match command:
                case cmd.Place() | cmd.ReserveHost() | cmd.FreeHost() | cmd.Log():
                    pass
                case cmd.Persist():
                    self.saved = self.core.state.durable()
                case cmd.ReadRoom(group=group, admit=admit):
                    work[:0] = self.core.handle(self.read_room(group, admit))
                case cmd.Act():
                    work[:0] = self.core.handle(self.act(command))
                case cmd.ReleaseProcesses():
                    self.release_processes(command)
                    if not command.leaver:
                        released = ev.ProcessesReleased(command.group, command.job, command.restore)
                        work[:0] = self.core.handle(released)
                case cmd.MeetNewcomer(group=group, job=job):
                    work.extend(self.core.handle(ev.NewcomerTurn(group, job)))
                case cmd.Refuse():
                    self.answers.append(command)
                    work.clear()
                case cmd.AnswerSwitch():
                    self.answers.append(command)
                    self.switched(command)
                case cmd.AnswerRelease():
                    self.answers.append(command)
                case cmd.EvictWhenGone(job=job):
                    self.leave(job)  # the exit watch evicts it; its release follows
                case _:
                    assert_never(command)

    def read_room(self, group: str, admit: str) -> ev.RoomRead:
        truth = self.truth
        seen = truth.on_device()
        footprints = {job: truth.device_bytes(job) for job in [admit, *seen]}
        admission = None if admit in truth.unknown else {"gpu0": FOOTPRINTS[admit]}
        free = {"gpu0": CAPACITY - truth.used()}
        return ev.RoomRead(group, seen, admission, free, footprints)

    def act(self, act: cmd.Act) -> ev.ActionDone | ev.ActionFailed:
        """The simulated backend's step (a planted failure first). A restore
        is never refused for room here: the device model lets it overflow,
        and an invariant says whether it did."""
        group, job, where = act.group, act.job, self.truth.where[act.job]
        assert act.step != "lock" or job not in self.let_go, f"{job}, let go, is locked again"
        if self.fail_next is not None and self.fail_next[0] == act.step:
            error, self.fail_next = self.fail_next[1], None
            return ev.ActionFailed(group, job, act.step, ev.Failure(error, "planted", job))
        done = "noop"
        if act.step in ("lock", "quiesce") and where == "running":
            self.truth.where[job], done = "locked", "lock"
        elif act.step == "checkpoint" and where in ON_DEVICE:
            if not self.host_holds(group, job):
                return ev.ActionFailed(group, job, act.step, ev.Failure("BackendError", "", job))
            self.truth.where[job], done = "host", "checkpoint"
        elif act.step == "restore" and where != "running":
            self.truth.where[job], done = "running", "restore"
        return ev.ActionDone(group, BackendAction(job=job, action=done))  # type: ignore[arg-type]

    def host_holds(self, group: str, job: str) -> bool:
        """The checkpoint asks the core's ledger first, as the CUDA backends do."""
        available = HOST - self.truth.parked() - self.truth.other_checkpoint
        asked = ev.HostAsked(group, job, FOOTPRINTS[job], available)
        held = self.core.handle(asked)
        assert sum(self.core.state.host_held.values()) <= HOST - self.truth.parked(), (
            "the core holds more host memory than the host has"
        )
        self.core.handle(ev.HostDone(group, job))
        return any(isinstance(command, cmd.ReserveHost) for command in held)

    def release_processes(self, command: cmd.ReleaseProcesses) -> None:
        """The backend lets the job's processes go: its state back on the
        device where it fits (and where asked), else it stays parked."""
        job = command.job
        assert self.told[job] <= self.released[job], (
            f"the processes of {job} were let go: membership {self.told[job]}, which the "
            f"agent was told of, is not the one released ({self.released[job]})"
        )
        where, fits = self.truth.where[job], self.truth.used() + FOOTPRINTS[job] <= CAPACITY
        if where == "locked" or (where == "host" and command.restore and fits):
            self.truth.where[job] = "running"

    def switched(self, answer: cmd.AnswerSwitch) -> None:
        """After a switch: only the admitted job runs but for jobs that left
        (released), and jobs share the device only with co-residency."""
        if answer.quiesce:
            return
        running = [job for job in self.truth.running() if not self.core.released(GROUP, job)]
        assert running in ([answer.admit], []) if answer.admit else running == [], (
            f"after admitting {answer.admit or 'nobody'}, members {running} run"
        )
        if self.co_residency == "off" and answer.admit:
            assert self.truth.on_device() == [answer.admit], (
                f"{self.truth.on_device()} on the device with co-residency off"
            )

    def request(self, event: ev.Event) -> None:
        """A request of the scheduler: it ends in exactly one answer."""
        self.answers = []
        self.carry_out(self.core.handle(event))
        assert len(self.answers) == 1, f"{event} ended in {self.answers}"

    # -- the scheduler's side ----------------------------------------------------------

    def join(self, job: str) -> None:
        if not self.member[job]:
            self.incarnation[job] += 1
            self.member[job] = True

    def leave(self, job: str) -> None:
        if self.member[job]:
            self.member[job] = False
            self.pending.append((job, self.incarnation[job]))

    @rule(job=st.sampled_from(JOBS))
    def job_joins(self, job: str) -> None:
        self.join(job)

    @rule(job=st.sampled_from(JOBS))
    def job_leaves(self, job: str) -> None:
        self.leave(job)

    @rule(
        data=st.data(),
        phase=st.sampled_from(["switch", "switch", "quiesce"]),
        late=st.booleans(),
        fails=st.sampled_from([None, None, None, *[(s, e) for s in STEPS for e in FAILURES]]),
        unseen=st.sampled_from([None, None, *JOBS]),
    )
    def switch(
        self,
        data: st.DataObject,
        phase: SwitchPhase,
        late: bool,
        fails: tuple[str, str] | None,
        unseen: str | None,
    ) -> None:
        """The scheduler moves the members out, and one in (or none); a step
        of it may fail, and NVML may lose (or regain) sight of a job's size."""
        self.fail_next = fails
        self.truth.unknown ^= {unseen} if unseen else set()
        members = [job for job in JOBS if self.member[job]]
        admit = data.draw(st.sampled_from(["", *members])) if phase == "switch" else ""
        # What the scheduler believes is there: whatever it placed and never moved.
        evict = [job for job in JOBS if job != admit and self.truth.where[job] != "none"]
        named = [job for job in [admit, *evict] if job in members]
        self.plan += 1
        request = SwitchInput(
            group=GROUP, epoch=self.plan, move=NodeMove(node=NODE, admit=admit, evict=evict),
            plan=self.plan - 2 if late else self.plan, co_residency=self.co_residency,
            phase=phase, incarnations={job: self.incarnation[job] for job in named},
        )  # fmt: skip
        here = self.core.state.groups.get(GROUP)
        if request.plan >= (here.latest_plan if here is not None else 0):
            # The switch names them, whatever comes of its steps.
            for job in named:
                self.told[job] = max(self.told[job], self.incarnation[job])
                if self.told[job] > self.released[job] or job == admit:
                    self.let_go.discard(job)
        self.core.handle(ev.GpusClaimed(GROUP, [], NODE))
        self.request(ev.SwitchAsked(request, co_residency=True))

    @rule(data=st.data())
    def release_arrives(self, data: st.DataObject) -> None:
        """One of the releases under way reaches the agent, in any order (a
        late one after its job joined again and a switch said so)."""
        if not self.pending:
            return
        job, incarnation = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        late = self.told[job] > incarnation
        before = self.core.state.model_copy(deep=True)
        if not late:
            self.released[job] = max(self.released[job], incarnation)
            self.let_go.add(job)
        self.request(ev.ReleaseAsked(GROUP, job, [], incarnation))
        if late:
            assert self.answers == [cmd.AnswerRelease(GROUP, job, too_late_for=incarnation)]
            assert self.core.state.jobs == before.jobs, "a late release changed a membership"

    @rule(job=st.sampled_from(JOBS), new=st.booleans())
    def process_registers(self, job: str, new: bool) -> None:
        if new:
            self.let_go.discard(job)  # the job is back
        self.carry_out(self.core.handle(ev.ProcessRegistered(GROUP, job, new)))

    @rule(job=st.sampled_from(JOBS))
    def processes_exit(self, job: str) -> None:
        """Every process of the job exits: its state goes with them."""
        self.truth.where[job] = "none"
        self.let_go.discard(job)
        self.carry_out(self.core.handle(ev.ProcessesExited(GROUP, job)))

    @rule(units=st.sampled_from([0, 4, 9]))
    def another_groups_checkpoint(self, units: int) -> None:
        """Another group's checkpoint holds host memory meanwhile (or ends)."""
        if self.truth.other_checkpoint:
            self.core.handle(ev.HostDone(OTHER_GROUP, "z"))
            self.truth.other_checkpoint = 0
        if units:
            asked = ev.HostAsked(OTHER_GROUP, "z", units, HOST - self.truth.parked())
            if any(isinstance(c, cmd.ReserveHost) for c in self.core.handle(asked)):
                self.truth.other_checkpoint = units

    @rule()
    def agent_restarts(self) -> None:
        """The record rebuilt from what was last saved; a checkpoint under
        way (another group's) ended with the agent."""
        self.truth.other_checkpoint = 0
        self.core = self.core_kind(NodeState.restarted(NODE, self.saved))

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def the_device_holds_no_more_than_it_has(self) -> None:
        assert self.truth.used() <= CAPACITY, f"the device holds {self.truth}"

    @invariant()
    def host_memory_held_fits_in_the_host(self) -> None:
        held = sum(self.core.state.host_held.values())
        assert self.truth.parked() + held <= HOST, f"{held} held beside {self.truth}"

    @invariant()
    def what_was_let_go_stays_let_go(self) -> None:
        """Across restarts too: a job let go is never switched again until it is back."""
        kept = {job for job in JOBS if self.core.released(GROUP, job)}
        assert self.let_go <= kept, f"{sorted(self.let_go - kept)} let go, and forgotten"

    @invariant()
    def no_member_waits_to_be_let_go(self) -> None:
        """A job that left while parked and is a member again (a switch said
        so) is never among the leavers to let go once the GPUs are free."""
        for here in self.core.state.groups.values():
            back = [job for job in here.parked_leavers if self.told[job] > self.released[job]]
            assert not back, f"members {back} wait among the leavers to be let go"

    @invariant()
    def nothing_is_left_half_done(self) -> None:
        assert all(here.switch is None for here in self.core.state.groups.values())

    @invariant()
    def the_record_round_trips_through_json(self) -> None:
        state = self.core.state
        assert NodeState.model_validate_json(state.model_dump_json()) == state
