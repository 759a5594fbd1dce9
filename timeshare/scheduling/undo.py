"""Undoing a message that failed part-way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from timeshare.scheduling.base import (
    QueueBase,
)
from timeshare.scheduling.state import GroupState, StoredSwitch, StoredTurn


@dataclass(frozen=True)
class Snapshot:
    """The state before a message, so that a handler that fails part-way can
    be undone. The bounded histories are only appended to (and the last turn
    closed), so a shallow copy and the last turn's fields are enough of them."""

    core: dict[str, Any]
    turns: list[StoredTurn]
    last_turn: dict[str, Any] | None
    switches: list[StoredSwitch]


def _same_objects(these: list[Any], those: list[Any]) -> bool:
    return len(these) == len(those) and all(a is b for a, b in zip(these, those, strict=True))


class Undoing(QueueBase):
    def snapshot(self) -> Snapshot:
        """Cheap enough to take before every message (well under a millisecond)."""
        state = self.state
        return Snapshot(
            core=state.model_dump(exclude={"recent_turns", "recent_switches"}),
            turns=list(state.recent_turns),
            last_turn=state.recent_turns[-1].model_dump() if state.recent_turns else None,
            switches=list(state.recent_switches),
        )

    def changed_since(self, snapshot: Snapshot) -> bool:
        state = self.state
        turns, switches = state.recent_turns, state.recent_switches
        return (
            state.model_dump(exclude={"recent_turns", "recent_switches"}) != snapshot.core
            or not _same_objects(turns[:-1], snapshot.turns[:-1])
            or len(turns) != len(snapshot.turns)
            or (turns[-1].model_dump() if turns else None) != snapshot.last_turn
            or not _same_objects(switches, snapshot.switches)
        )

    def restore(self, snapshot: Snapshot) -> None:
        """Put the state back as it was when ``snapshot`` was taken."""
        turns = list(snapshot.turns)
        if turns and snapshot.last_turn is not None:
            turns[-1] = StoredTurn.model_validate(snapshot.last_turn)
        self.state = GroupState.model_validate(
            {**snapshot.core, "recent_turns": turns, "recent_switches": list(snapshot.switches)}
        )
