"""The rules a group decides by: one versioned record, fixed when the group
is created and kept for as long as it runs, across continue-as-new, so that
an upgrade never changes how a running group decides. The group workflow
asks Temporal once, at creation, which version a new group gets (the table
in scheduling/versions.py: a history from an older scheduler replays with
its own rules); the core reads the record, never a patch.

Versions:
1. FIFO, one lease for everyone, no yield requests on a timer (groups
   created before scheduling policies);
2. scheduling policies: fair share, weights, priorities, idle and contended
   leases (docs/guide/policies.md, "Group policy");
3. and fair share holds the turn open for a yielder behind its share
   (scheduling/anticipation.py);
4. and switch costs are weighed: a backfill job is granted only a gap longer
   than its switches, anticipation lasts no longer than a switch
   (scheduling/switch_costs.py);
5. and a regular job's predicted request, once due, still holds a backfill
   waiter back for a twentieth of its gap: a request that comes a little
   late finds its state where it left it;
6. and the group looks again when a waiter held back by switch costs may
   go even while a turn is held (the holder's turn limit counts from then),
   and a backfill job that joins again as a regular one starts level with
   the least-served regular member, as a newcomer does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from timeshare.scheduling.versions import (
    NEWEST_RULES as NEWEST,
)
from timeshare.scheduling.versions import (
    RULES_ANTICIPATION,
    RULES_LEGACY,
    RULES_OVERDUE_ASKS,
    RULES_POLICIES,
    RULES_STEADY_DEADLINES,
    RULES_SWITCH_COSTS,
)

__all__ = [
    "NEWEST",
    "RULES_ANTICIPATION",
    "RULES_LEGACY",
    "RULES_OVERDUE_ASKS",
    "RULES_POLICIES",
    "RULES_STEADY_DEADLINES",
    "RULES_SWITCH_COSTS",
    "Rules",
]


@dataclass(frozen=True)
class Rules:
    version: int

    @classmethod
    @cache  # asked on most decisions; a handful of versions exist
    def of(cls, version: int) -> Rules:
        if not RULES_LEGACY <= version <= NEWEST:
            raise ValueError(
                f"rules version {version} is unknown to this scheduler (it knows 1 to {NEWEST}): "
                "upgrade the scheduler before running it on this group"
            )
        return cls(version)

    @property
    def policies(self) -> bool:
        return self.version >= RULES_POLICIES

    @property
    def anticipation(self) -> bool:
        return self.version >= RULES_ANTICIPATION

    @property
    def switch_costs(self) -> bool:
        return self.version >= RULES_SWITCH_COSTS

    @property
    def overdue_asks(self) -> bool:
        return self.version >= RULES_OVERDUE_ASKS

    @property
    def steady_deadlines(self) -> bool:
        return self.version >= RULES_STEADY_DEADLINES
