"""What a switch moves: which nodes must take a job's state off and bring
another's on, and the plan that says so."""

from __future__ import annotations

from timeshare.refusals import Refusal
from timeshare.scheduling import ordering
from timeshare.scheduling.base import UNKNOWN_RESIDENT, QueueError
from timeshare.scheduling.state import GroupState, StoredMove, SwitchPlan, Waiter


def needs_switch(state: GroupState, now: float) -> bool:
    """True when a waiter may go next but nodes must move first."""
    return (
        state.turn is None
        and state.switching is None
        and not state.anticipation
        and bool(ordering.eligible(state, now))
    )


def moves_for(state: GroupState, job: str) -> list[StoredMove]:
    moves = []
    for node in state.jobs[job].nodes:
        resident = state.resident.get(node, UNKNOWN_RESIDENT)
        if resident != job:
            evict = [] if resident == UNKNOWN_RESIDENT else [resident]
            moves.append(StoredMove(node=node, admit=job, evict=evict))
    return moves


def leaving_elsewhere(state: GroupState, moves: list[StoredMove]) -> list[StoredMove]:
    """The jobs these moves evict leave their other nodes too, except
    drained ones: their agents may be down for maintenance."""
    left_alone = {move.node for move in moves} | set(state.drained)
    leaving = {job for move in moves for job in move.evict}
    return [
        StoredMove(node=node, admit="", evict=[job])
        for node, job in sorted(state.resident.items())
        if job in leaving and node not in left_alone
    ]


def now_resident(state: GroupState, move: StoredMove) -> None:
    if move.admit:
        state.resident[move.node] = move.admit
    else:
        # Nothing of the group's runs there; the next switch there looks.
        state.resident.pop(move.node, None)


def current_plan(state: GroupState) -> SwitchPlan:
    if state.switching is None:
        raise QueueError(Refusal.FAILED_PRECONDITION, "no switch is under way")
    return state.switching


def plan_switch(state: GroupState, waiter: Waiter, now: float, prefetch: bool) -> SwitchPlan:
    """Plan the switch that brings ``waiter``'s job onto its nodes."""
    state.plans += 1
    moves = moves_for(state, waiter.job)
    moves += leaving_elsewhere(state, moves)
    plan = SwitchPlan(
        waiter=waiter,
        epoch=state.epoch + 1,
        moves=moves,
        started_at=now,
        number=state.plans,
        whole_jobs=True,
        prefetch=prefetch,
    )
    state.switching = plan
    state.since = now
    return plan
