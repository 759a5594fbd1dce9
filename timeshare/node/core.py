"""NodeCore: a node agent's decisions, as typed events in and commands out,
the way GroupCore makes a group's. The agent's activities
(activities/switch.py) turn each request, reading and backend outcome into
an event, hand it to ``handle`` and carry out the commands in order; every
decision is made here and tested without Temporal, a backend or a clock:

- whether a switch may run (its node, a plan older than one that ran);
- which of the group's other jobs leave the device and which stay locked
  beside the admitted one (co-residency, timeshare/node/room.py), and the
  steps, one at a time, that make it so;
- what a failed step means for the scheduler (its failure kind);
- whether a release is late (its membership ended and a later one is
  here), whether the job's state comes back to the device or waits parked,
  and when jobs that left while parked come back;
- what a process that registers while another job holds the device gets;
- whether a checkpoint may hold the host memory it needs;
- which jobs whose processes exited are still members here.

``handle`` is the only way to change the record (NodeState): each handler
works on a draft, kept only when it returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timeshare.models import NO_DEVICE_ROOM, NOT_ENOUGH_HOST_MEMORY, FailureKind
from timeshare.node import commands as cmd
from timeshare.node import events as ev
from timeshare.node.room import RoomPlan, extra, plan_room
from timeshare.node.state import GroupHere, JobHere, NodeState, SwitchHere, key_of
from timeshare.scheduling.draft import draft_model

SUPERSEDED = "Superseded"
RELEASE_FAILED = "ReleaseFailed"
GiB = 2**30


class NodeCore:
    def __init__(self, state: NodeState) -> None:
        self.state = state
        # The record the draft of the event being handled was made from.
        self._record = state
        self._handlers: dict[type[Any], Callable[[Any], list[cmd.Command]]] = {
            ev.GpusClaimed: self._gpus_claimed,
            ev.SwitchAsked: self._switch_asked,
            ev.RoomRead: self._room_read,
            ev.RoomUnread: self._room_unread,
            ev.ActionDone: self._action_done,
            ev.ActionFailed: self._action_failed,
            ev.ReleaseAsked: self._release_asked,
            ev.ProcessesReleased: self._processes_released,
            ev.ReleaseFailed: self._release_failed,
            ev.ProcessRegistered: self._process_registered,
            ev.NewcomerTurn: self._newcomer_turn,
            ev.ProcessesExited: self._processes_exited,
            ev.HostAsked: self._host_asked,
            ev.HostDone: self._host_done,
        }

    def handle(self, event: ev.Event) -> list[cmd.Command]:
        """Apply the event; what to do about it, in order. A handler that
        fails leaves the record exactly as it was."""
        state = self.state
        # A draft that shares every group's and job's entry with the record
        # until a handler changes it (``_group``, ``_job``): copying them all
        # at each event made an agent's CPU per switch grow with the jobs it
        # knows (43 ms at 450 jobs in `bench scale`).
        self._record = state
        self.state = state.model_copy(
            update={
                "groups": dict(state.groups),
                "jobs": dict(state.jobs),
                "host_held": dict(state.host_held),
            }
        )
        try:
            return self._handlers[type(event)](event)
        except BaseException:
            self.state = state
            raise

    def _group(self, group: str) -> GroupHere:
        """The group's entry in the draft, to change: copied from the record
        at its first change (created if new)."""
        entry = self.state.groups.get(group)
        if entry is None or entry is self._record.groups.get(group):
            entry = GroupHere() if entry is None else draft_model(entry)
            self.state.groups[group] = entry
        return entry

    def _job(self, group: str, job: str) -> JobHere:
        """The job's entry in the draft, to change, as ``_group``."""
        key = key_of(group, job)
        entry = self.state.jobs.get(key)
        if entry is None or entry is self._record.jobs.get(key):
            entry = JobHere() if entry is None else draft_model(entry)
            self.state.jobs[key] = entry
        return entry

    # -- questions (they decide nothing) ------------------------------------------

    def gpus_of(self, group: str, node_gpus: int) -> list[int]:
        """The GPUs a switch or release of the group holds while it runs:
        those its policy claims here, else all of the node's (a node that
        cannot count them is one GPU)."""
        here = self.state.groups.get(group)
        if here is not None and here.gpus:
            return sorted(here.gpus)
        return list(range(max(1, node_gpus)))

    def released(self, group: str, job: str) -> bool:
        return self.state.released(group, job)

    def admitted(self, group: str) -> str:
        here = self.state.groups.get(group)
        return here.admitted if here is not None else ""

    # -- a switch ------------------------------------------------------------------

    def _gpus_claimed(self, event: ev.GpusClaimed) -> list[cmd.Command]:
        if event.gpus is not None and event.node in ("", self.state.node):
            self._group(event.group).gpus = list(event.gpus)
        return []

    def _switch_asked(self, event: ev.SwitchAsked) -> list[cmd.Command]:
        request, state = event.request, self.state
        group, move = request.group, request.move
        if move.node != state.node:
            message = f"switch for node {move.node!r} reached the agent of node {state.node!r}"
            return [cmd.Refuse("", message, non_retryable=True)]
        here = self._group(group)
        if request.plan < here.latest_plan:
            message = (
                f"switch plan {request.plan} of group {group!r} was superseded by plan "
                f"{here.latest_plan}"
            )
            return [cmd.Refuse(SUPERSEDED, message, non_retryable=True)]
        here.latest_plan = request.plan
        commands: list[cmd.Command] = [cmd.Place(group, list(request.gpus))]
        durable = state.durable(group)
        if move.admit:
            # Admitted: a member again, whatever it did before.
            self._member_again(group, move.admit)
        self._note_members(group, request.incarnations)
        if self.state.durable(group) != durable:
            commands.append(cmd.Persist())
        if request.phase == "quiesce":
            # Stopped where they are, state left on the device, so that none
            # of their ranks runs on once the checkpoint starts on any node.
            evict = sorted(move.evict)
            here.switch = SwitchHere(
                admit="", others=evict, steps=[(job, "quiesce") for job in evict], quiesce=True
            )
            return [*commands, *self._next_step(group)]
        shared = request.co_residency == "auto" and event.co_residency
        here.co_residency = shared
        if not move.admit:
            # The job leaves with its ranks elsewhere; nobody needs the room.
            others = sorted(move.evict)
            room = RoomPlan(evict=[] if shared else others, keep=others if shared else [])
            return [*commands, *self._plan(group, "", others, room)]
        here.switch = SwitchHere(admit=move.admit, others=sorted(move.evict))
        return [*commands, cmd.ReadRoom(group, move.admit, shared)]

    def _room_read(self, event: ev.RoomRead) -> list[cmd.Command]:
        """Evict what the backend itself sees resident too, not only what
        the scheduler believes: after an agent restart the two can differ."""
        group, here = event.group, self._group(event.group)
        assert here.switch is not None, f"a room read for group {group!r}, which switches nothing"
        admit = here.switch.admit
        seen = set(event.seen)
        others = sorted((set(here.switch.others) | seen) - {admit})
        if not here.co_residency:
            return self._plan(group, admit, others, RoomPlan(evict=others, keep=[]))
        # Lock the others where the admitted job fits beside them; evict,
        # least recently run first, only what it needs room for.
        on_device = sorted(
            (job for job in others if job in seen),
            key=lambda job: self._job(group, job).last_ran,
        )
        need = extra(event.admission, event.footprints.get(admit))
        room = plan_room(need, event.free, on_device, event.footprints)
        # Jobs the scheduler still names but that are off the device already:
        # a checkpoint of them is a no-op, and never co-residency.
        off = [job for job in others if job not in seen]
        return self._plan(group, admit, others, RoomPlan(evict=room.evict + off, keep=room.keep))

    def _plan(self, group: str, admit: str, others: list[str], room: RoomPlan) -> list[cmd.Command]:
        """The steps of a switch: lock the jobs that stay (a job that left
        keeps running beside the admitted one: nobody would ever unlock it),
        checkpoint those that leave, restore the admitted one."""
        steps: list[tuple[str, cmd.Step]] = [
            (job, "lock") for job in room.keep if not self.state.released(group, job)
        ]
        steps += [(job, "checkpoint") for job in room.evict]
        steps += [(admit, "restore")] if admit else []
        self._group(group).switch = SwitchHere(
            admit=admit, others=others, kept=room.keep, evicted=room.evict, steps=steps
        )
        return self._next_step(group)

    def _room_unread(self, event: ev.RoomUnread) -> list[cmd.Command]:
        self._group(event.group).switch = None
        return [cmd.Refuse(FailureKind.CHECKPOINT, event.failure.message)]

    def _next_step(self, group: str) -> list[cmd.Command]:
        here = self._group(group)
        switch = here.switch
        assert switch is not None
        if switch.steps:
            job, step = switch.steps[0]
            return [cmd.Act(group, job, step)]
        here.switch = None
        answer = cmd.AnswerSwitch(
            group, switch.admit, switch.others, switch.kept, switch.evicted, switch.quiesce
        )
        if switch.quiesce:
            return [answer]
        if switch.admit:
            here.admitted = switch.admit
            self.state.clock += 1
            self._job(group, switch.admit).last_ran = self.state.clock
            return [answer]
        here.admitted = ""
        return [*self._bring_back_leavers(group), answer]

    def _action_done(self, event: ev.ActionDone) -> list[cmd.Command]:
        here = self._group(event.group)
        if here.switch is None:
            return []  # a newcomer's step
        here.switch.steps.pop(0)
        return self._next_step(event.group)

    def _action_failed(self, event: ev.ActionFailed) -> list[cmd.Command]:
        here = self._group(event.group)
        if here.switch is None:
            message = f"could not lock newcomer {event.group}/{event.job}: {event.failure.message}"
            return [cmd.Log(message, warning=True)]
        here.switch = None
        return [_refusal(event)]

    # -- a release -----------------------------------------------------------------

    def _release_asked(self, event: ev.ReleaseAsked) -> list[cmd.Command]:
        group, job = event.group, event.job
        commands: list[cmd.Command] = [] if event.gpus is None else [cmd.Place(group, event.gpus)]
        entry = self._job(group, job)
        if event.incarnation and entry.member_incarnation > event.incarnation:
            return [*commands, cmd.AnswerRelease(group, job, too_late_for=event.incarnation)]
        entry.released_incarnation = max(entry.released_incarnation, event.incarnation)
        # Marked first: no switch freezes it again from here on.
        entry.released = True
        here = self._group(group)
        # Co-residency off: the device is the holder's alone, so what the job
        # left parked waits in host memory until the GPU is free.
        restore = here.admitted in ("", job) or here.co_residency
        return [*commands, cmd.Persist(), cmd.ReleaseProcesses(group, job, restore)]

    def _processes_released(self, event: ev.ProcessesReleased) -> list[cmd.Command]:
        group, job, here = event.group, event.job, self._group(event.group)
        parked = set(here.parked_leavers)
        parked = parked - {job} if event.restore else parked | {job}
        here.parked_leavers = sorted(parked)
        commands: list[cmd.Command] = [cmd.Persist()]
        if here.admitted == job:
            here.admitted = ""
            commands += self._bring_back_leavers(group)
        return [*commands, cmd.AnswerRelease(group, job)]

    def _release_failed(self, event: ev.ReleaseFailed) -> list[cmd.Command]:
        message = f"releasing {event.group}/{event.job} on node {self.state.node}: "
        return [cmd.Refuse(RELEASE_FAILED, message + event.failure.message)]

    def _bring_back_leavers(self, group: str) -> list[cmd.Command]:
        """The group's GPUs here are free: jobs that left while another held
        them get their state back (their processes' CUDA calls go on)."""
        here = self._group(group)
        leavers, here.parked_leavers = here.parked_leavers, []
        back: list[cmd.Command] = [
            cmd.ReleaseProcesses(group, job, restore=True, leaver=True) for job in leavers
        ]
        return [cmd.Persist(), *back] if back else []

    # -- processes -----------------------------------------------------------------

    def _note_members(self, group: str, incarnations: dict[str, int]) -> None:
        """Jobs the scheduler names as members: one whose earlier membership
        was released here is the group's again (its processes are switched)."""
        for job, incarnation in incarnations.items():
            entry = self._job(group, job)
            entry.member_incarnation = max(entry.member_incarnation, incarnation)
            if incarnation > entry.released_incarnation:
                self._member_again(group, job)

    def _member_again(self, group: str, job: str) -> None:
        """The job is the group's again: its processes are switched, and
        what it left parked is its own again, never let go as a leaver's."""
        self._job(group, job).released = False
        here = self._group(group)
        if job in here.parked_leavers:
            here.parked_leavers = [leaver for leaver in here.parked_leavers if leaver != job]

    def _process_registered(self, event: ev.ProcessRegistered) -> list[cmd.Command]:
        group, job = event.group, event.job
        commands: list[cmd.Command] = []
        if event.new and self.state.released(group, job):
            # A new process: the job is back.
            self._member_again(group, job)
            commands.append(cmd.Persist())
        if self.admitted(group) not in ("", job):
            commands.append(cmd.MeetNewcomer(group, job))
        return commands

    def _newcomer_turn(self, event: ev.NewcomerTurn) -> list[cmd.Command]:
        """A process of ``job`` registered while another job of its group
        held the device here: it leaves the device (locked where the last
        switch kept jobs co-resident), unless its job left its group (a
        registration that comes again after an agent restart)."""
        group, job = event.group, event.job
        admitted = self.admitted(group)
        if self.state.released(group, job) or admitted in ("", job):
            return []
        step: cmd.Step = "lock" if self._group(group).co_residency else "checkpoint"
        return [cmd.Act(group, job, step)]

    def _processes_exited(self, event: ev.ProcessesExited) -> list[cmd.Command]:
        """A job that left its group, or was released here, is not evicted."""
        key = key_of(event.group, event.job)
        entry = self.state.jobs.get(key)
        if entry is not None and entry.released:
            self._job(event.group, event.job).released = False
            return [cmd.Persist()]
        return [cmd.EvictWhenGone(event.group, event.job)]

    # -- host memory -----------------------------------------------------------------

    def _host_asked(self, event: ev.HostAsked) -> list[cmd.Command]:
        """Hold the host memory a checkpoint needs, against every checkpoint
        under way on the node, whatever its group; refuse, before anything
        is locked, if the node or the job's cgroup cannot take it, rather
        than let an OOM killer pick a victim."""
        group, job, needed = event.group, event.job, event.needed
        key, held = key_of(group, job), self.state.host_held
        elsewhere = sum(count for other, count in held.items() if other != key)
        available = event.available - elsewhere
        if needed > available:
            message = (
                f"{NOT_ENOUGH_HOST_MEMORY}: job {group}/{job} holds {_gib(needed)} of device "
                f"memory but the host has {_gib(available)} available"
                + (f" ({_gib(elsewhere)} more held by checkpoints under way)" if elsewhere else "")
                + (f"; parked here already: {event.parked}" if event.parked else "")
                + "; nothing was moved"
            )  # fmt: skip
            return [cmd.Refuse(FailureKind.CHECKPOINT, message)]
        if event.room is not None and needed > event.room:
            message = (
                f"{NOT_ENOUGH_HOST_MEMORY}: job {group}/{job} holds {_gib(needed)} of device "
                f"memory but the memory limit of its cgroup {event.limit} leaves room for "
                f"{_gib(event.room)}; nothing was moved: raise the container's memory limit "
                "by the job's device memory, or run it with co-residency"
            )
            return [cmd.Refuse(FailureKind.CHECKPOINT, message)]
        held[key] = needed
        return [cmd.ReserveHost(group, job, needed)]

    def _host_done(self, event: ev.HostDone) -> list[cmd.Command]:
        held = self.state.host_held.pop(key_of(event.group, event.job), None)
        return [] if held is None else [cmd.FreeHost(event.group, event.job, held)]


def _refusal(event: ev.ActionFailed) -> cmd.Refuse:
    """What the scheduler hears of a failed step: the job whose state could
    not move in the details, so that the workflow knows whose it was."""
    error, message = event.failure.error, event.failure.message
    job = event.failure.job or event.job
    kind = FailureKind.RESTORE if event.step == "restore" else FailureKind.CHECKPOINT
    if error == "JobFailed":
        # Terminal: the workflow evicts the job named in the details.
        return cmd.Refuse(FailureKind.JOB_FAILED, message, (job,), non_retryable=True)
    if error == "NoDeviceRoom":
        # Nothing was restored and retrying finds the same: the workflow tells
        # it by the second detail and answers the waiting job.
        return cmd.Refuse(kind, message, (job, NO_DEVICE_ROOM), non_retryable=True)
    if error == "HookFailed" and kind == FailureKind.RESTORE:
        # An admit hook: the job's own turn fails (RestoreFailed aborts it).
        return cmd.Refuse(kind, message)
    if error == "HookFailed":
        # Retried like any failed checkpoint; then the workflow evicts the job
        # named in the details, whose own hooks hold the switch up.
        return cmd.Refuse(FailureKind.HOOK, message, (job,))
    return cmd.Refuse(kind, message, (job,))


def _gib(count: int) -> str:
    return f"{count / GiB:.1f} GiB"
