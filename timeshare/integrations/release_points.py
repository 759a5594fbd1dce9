"""Turns for frameworks whose only hooks are their own memory releases
(OpenRLHF, SkyRL): the job holds its turn from its first phase on, and
hands it over exactly where the framework has just put its GPU state away
(an engine asleep, a model's states offloaded), so that a switch there moves
only what the framework left on the device. Every GPU call of the job runs
inside a turn; what runs between two release points belongs to the phase the
last one began."""

from __future__ import annotations

import sys
import threading
from typing import Any

from timeshare.integrations.environment import turns_from_env
from timeshare.integrations.exits import leave_at_exit
from timeshare.integrations.turns import JobTurns, Turns, TurnTicket

SETUP = "setup"
_turns: Turns | None = None
_guard = threading.Lock()


def process_turns() -> Turns:
    """This process's turns: adopted from a ticket, else made from the
    environment on first use (the wrappers that call it travel between Ray
    processes; the turns stay in one)."""
    global _turns
    with _guard:
        if _turns is None:
            _turns = turns_from_env()
        return _turns


def use_turns(turns: Turns | None) -> None:
    """Set (or with None, forget) this process's turns, instead of the environment's."""
    global _turns
    with _guard:
        _turns = turns


def setup_turn(turns: Turns | None = None) -> Turns:
    """Hold the ``setup`` turn (engines starting, models loading) from here
    to the first phase; ``turns`` defaults to this process's."""
    turns = turns if turns is not None else process_turns()
    turns.acquire(SETUP)
    return turns


def ticket_of(turns: Turns | None) -> TurnTicket | None:
    """The ticket a pickled wrapper carries to another process of the job:
    there it takes the job's turns on (``adopt``) instead of joining again."""
    turns = turns if turns is not None else _turns
    return turns.ticket() if isinstance(turns, JobTurns) else None


def adopt(ticket: TurnTicket | None) -> None:
    """Take the job's turns on in this process, unless it has turns already
    (the process that wrote the ticket, or a wrapper unpickled before)."""
    global _turns
    if ticket is None:
        return
    with _guard:
        if _turns is not None:
            return
        _turns = JobTurns.adopt(ticket)
    leave_at_exit(_turns.close)


def entering(phase: str, turns: Turns | None = None) -> None:
    """The job's GPU work from here on belongs to ``phase``: take the turn if
    it is not held, hand it over if it was held for another phase. ``turns``
    defaults to this process's."""
    turns = turns if turns is not None else process_turns()
    if not turns.holding:
        turns.acquire(phase)
    elif turns.phase != phase:
        turns.handover(phase)


def wait(result: Any) -> Any:
    """Wait for a Ray call's result (an ObjectRef or a list of them); other
    values are already there."""
    ray = sys.modules.get("ray")
    if ray is None:
        return result
    if isinstance(result, ray.ObjectRef) or (
        isinstance(result, list) and result and all(isinstance(r, ray.ObjectRef) for r in result)
    ):
        return ray.get(result)
    return result
