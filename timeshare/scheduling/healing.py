"""A group rebuilt after its workflow task kept failing.

A run whose history the scheduler cannot replay (an SDK bug, or workflow
code that disagrees with what the history recorded) fails its workflow
task on every attempt: nothing can be granted, yielded or joined. The
scheduler's healer (workers/scheduler/healing/) then starts a new run of
the group from the last state the code could rebuild (the replayed part of
the history, or the run's own start) and the facts recorded after it: what
each message asked and what its job was told. This module applies those
facts to that state, as the new run's first event (RunStarted.heal).

What it keeps to, whatever the facts say:

- Nobody is granted while the facts are applied: the holder is the job
  last told a grant that it has not given back, and only that job.
- Every node a switch or release may have touched since is marked
  unknown, so that the next grant there moves state first (the agent then
  checkpoints whatever it finds there, not only what the group believed).
- Epochs, switch plans and memberships go on above every number the old
  run sent to an agent or told a job: an agent never refuses a new plan as
  stale, a job is never told an epoch twice, a late release never lets go
  of a later membership.
- Every member's lease starts afresh: nobody is evicted for a silence the
  stuck run could not record.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from timeshare.scheduling import deadlines, membership, turns
from timeshare.scheduling import events as ev
from timeshare.scheduling.base import UNKNOWN_RESIDENT, Group, QueueError, touch
from timeshare.scheduling.state import StoredGrant, StoredModel, Waiter

# How many heals a group remembers (GroupState.heal_times), and how many
# within HEAL_WINDOW_SECONDS the healer makes at once when each new run
# fails again before it has served: a fault that fails every new run the
# same way is then healed at that pace, not in a tight loop.
HEALS_REMEMBERED = 8
HEALS_ALLOWED = 3
HEAL_WINDOW_SECONDS = 600.0
# A run that completed this many workflow tasks served its jobs between its
# heal and its failure: the failure is a new one, healed at once.
SERVED_TASKS = 20


# Each fact is the message the history recorded, as the core takes it, or
# what its job was told; and when it was recorded.


class Joined(StoredModel):
    kind: Literal["joined"] = "joined"
    join: ev.Join
    at: float


class Left(StoredModel):
    kind: Literal["left"] = "left"
    leave: ev.Leave
    at: float


class Evicted(StoredModel):
    """An operator's eviction (the scheduler's own are not recorded as facts:
    their jobs stay members, and a lease that runs out again evicts them)."""

    kind: Literal["evicted"] = "evicted"
    evict: ev.Evict
    at: float


class Paused(StoredModel):
    kind: Literal["paused"] = "paused"
    pause: ev.Pause
    at: float


class Drained(StoredModel):
    kind: Literal["drained"] = "drained"
    drain: ev.Drain
    at: float


class Heard(StoredModel):
    """A heartbeat went through."""

    kind: Literal["heard"] = "heard"
    heartbeat: ev.Heartbeat
    at: float


class Asked(StoredModel):
    """An acquire was accepted: its job waits, in this order, until told."""

    kind: Literal["asked"] = "asked"
    acquire: ev.Acquire
    at: float


class Granted(StoredModel):
    """A job was told this grant (an acquire's answer)."""

    kind: Literal["granted"] = "granted"
    grant: StoredGrant
    at: float


class KeptTurn(StoredModel):
    """The holder went on into its next phase (keep_turn's answer)."""

    kind: Literal["kept-turn"] = "kept-turn"
    grant: StoredGrant
    at: float


class GaveBack(StoredModel):
    """A yield went through (on its own, or first in a next_turn)."""

    kind: Literal["gave-back"] = "gave-back"
    given: ev.Yield
    at: float


class Withdrew(StoredModel):
    """A request ended unanswered: withdrawn by its caller, timed out or aborted."""

    kind: Literal["withdrew"] = "withdrew"
    withdrawn: ev.CancelAcquire
    at: float


HealFact = Annotated[
    Joined
    | Left
    | Evicted
    | Paused
    | Drained
    | Heard
    | Asked
    | Granted
    | KeptTurn
    | GaveBack
    | Withdrew,
    Field(discriminator="kind"),
]


class HealInput(StoredModel):
    """How a new run of a stuck group is rebuilt: carried in its start
    input, so that the group's history says how it healed."""

    # What the failing workflow task said, in one line.
    cause: str
    failed_run_id: str
    # Where the state came from: "the replay of events 1-125", "the run's start".
    rebuilt_from: str
    # What happened after that point, in history order.
    facts: list[HealFact] = Field(default_factory=list)
    # The largest switch plan number, epoch and membership incarnation the
    # failed run sent to any agent.
    plans_sent: int = 0
    epochs_sent: int = 0
    incarnations_sent: int = 0
    # Nodes where a switch or a release ran, or may have run, after that point.
    touched_nodes: list[str] = Field(default_factory=list)


def recent_heals(heal_times: list[float], now: float) -> int:
    return sum(1 for at in heal_times if now - at < HEAL_WINDOW_SECONDS)


def heal_allowed_at(heal_times: list[float], now: float, served_tasks: int) -> float:
    """When the group may be healed: ``now``, unless its failing run served
    fewer than SERVED_TASKS tasks and it was healed HEALS_ALLOWED times in
    the window; then once the oldest of those heals has left the window."""
    recent = sorted(at for at in heal_times if now - at < HEAL_WINDOW_SECONDS)
    if served_tasks >= SERVED_TASKS or len(recent) < HEALS_ALLOWED:
        return now
    return recent[-HEALS_ALLOWED] + HEAL_WINDOW_SECONDS


def heal(group: Group, rebuild: HealInput, now: float) -> str:
    """Bring the state up to what the facts say; a line for the log."""
    state = group.state
    believed = dict(state.resident)
    touched = set(rebuild.touched_nodes)
    if state.switching is not None:
        touched |= {move.node for move in state.switching.moves}
        state.switching = None
    state.failing = None
    state.degraded_cause = ""
    state.incarnations = max(state.incarnations, rebuild.incarnations_sent)
    # Unknown everywhere while the facts are applied: no rule grants a turn
    # that needs no move meanwhile.
    state.resident = {}
    for fact in rebuild.facts:
        _apply(group, fact)
    state.resident = {
        node: job if node not in touched and job in state.jobs else UNKNOWN_RESIDENT
        for node, job in believed.items()
    }
    state.resident.update({node: UNKNOWN_RESIDENT for node in touched})
    turn = state.turn
    if turn is not None:
        # Granted after every other job's state left its nodes.
        state.resident.update({node: turn.job for node in state.jobs[turn.job].nodes})
    state.epoch = max(state.epoch, rebuild.epochs_sent)
    state.plans = max(state.plans, rebuild.plans_sent)
    state.anticipation = None
    state.since = now
    for entry in state.jobs.values():
        entry.last_seen = max(entry.last_seen, now)
    state.heals += 1
    state.heal_times = [*state.heal_times, now][-HEALS_REMEMBERED:]
    group.tell(now)
    holder = f"{turn.job} (epoch {turn.told_epoch})" if turn is not None else "nobody"
    return (
        f"healed from {rebuild.rebuilt_from} and {len(rebuild.facts)} later facts, after "
        f"run {rebuild.failed_run_id} failed its workflow task ({rebuild.cause}); "
        f"holder {holder}, {len(state.queue)} waiting, unknown on "
        f"{', '.join(sorted(touched)) or 'no node'}"
    )


def _apply(group: Group, fact: HealFact) -> None:
    """One fact; a fact the state cannot take (it knew better already, or a
    refusal) changes nothing."""
    state = group.state
    try:
        match fact:
            case Joined(join=join):
                membership.join(
                    group, join.job, join.nodes, join.token_hash, fact.at,
                    join.weight, join.priority, join.backfill,
                )  # fmt: skip
            case Left(leave=leave):
                membership.leave(group, leave.job, fact.at)
            case Evicted(evict=evict):
                membership.evict(group, evict.job, evict.reason, fact.at)
            case Paused(pause=pause):
                turns.pause(group, pause.paused, fact.at)
            case Drained(drain=drain):
                turns.drain(group, drain.node, drain.drained, fact.at)
            case Heard(heartbeat=heartbeat):
                touch(state, heartbeat.job, fact.at)
            case Asked(acquire=acquire):
                _asked(group, acquire, fact.at)
            case Granted():
                _granted(group, fact.grant, fact.at)
            case KeptTurn():
                _kept_turn(group, fact)
            case GaveBack(given=given):
                turns.yield_turn(group, given.job, given.epoch, fact.at)
            case Withdrew(withdrawn=withdrawn):
                turns.cancel(group, withdrawn.job, withdrawn.request_id, fact.at)
    except QueueError:
        pass


def _asked(group: Group, acquire: ev.Acquire, at: float) -> None:
    state = group.state
    turn = state.turn
    if (
        acquire.job not in state.jobs
        or (turn is not None and turn.job == acquire.job)
        or any(waiter.job == acquire.job for waiter in state.queue)
        or state.served_requests.get(acquire.job) == acquire.request_id
        or acquire.request_id in state.aborted_requests
    ):
        return
    touch(state, acquire.job, at)
    turns.enqueue(
        state,
        Waiter(job=acquire.job, request_id=acquire.request_id, ticket=0, since=at,
               phase=acquire.phase),
    )  # fmt: skip


def _granted(group: Group, grant: StoredGrant, at: float) -> None:
    state = group.state
    turn = state.turn
    entry = state.jobs.get(grant.job)
    if entry is None:
        return
    if turn is not None and turn.job == grant.job and turn.told_epoch == grant.told_epoch:
        return
    if turn is not None and turn.job in state.jobs:
        # Its turn ended without a yield: the group took it back, as from a
        # job preempted; its next yield or acquire is answered as such.
        deadlines.preempt(group, turn, at)
    elif turn is not None:
        state.turn = None
    state.queue = [
        waiter
        for waiter in state.queue
        if waiter.request_id != grant.request_id
        and not (waiter.job == grant.job and waiter.resumes_epoch == grant.resumes_epoch > 0)
    ]
    state.epoch = max(state.epoch, grant.epoch)
    state.grants += 1
    entry.turns += 1
    entry.preempted = False
    entry.waited_seconds += grant.waited_seconds
    state.turn = grant.model_copy()
    turns.remember_turn(state, state.turn, requested_at=grant.granted_at - grant.waited_seconds)


def _kept_turn(group: Group, fact: KeptTurn) -> None:
    state = group.state
    turn = state.turn
    if turn is None or turn.job != fact.grant.job or turn.told_epoch != fact.grant.told_epoch:
        return
    turns.charge(state, turn.job, turn, fact.at)
    turns.end_turn(state, turn, fact.at, "")
    state.turn = fact.grant.model_copy()
