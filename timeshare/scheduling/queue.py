"""The lock queue of one group, whole: its parts, each one concern, over one
GroupState (see the package's docstring for the rules they keep)."""

from __future__ import annotations

from timeshare.scheduling.anticipation import Anticipating
from timeshare.scheduling.deadlines import Deadlines
from timeshare.scheduling.membership import Membership
from timeshare.scheduling.prefetch import Prefetching
from timeshare.scheduling.reporting import Reporting
from timeshare.scheduling.switch_failures import SwitchFailures
from timeshare.scheduling.switching import Switching
from timeshare.scheduling.turns import Turns


class LockQueue(
    Membership,
    Turns,
    Anticipating,
    Deadlines,
    Switching,
    SwitchFailures,
    Prefetching,
    Reporting,
):
    """Decisions over a GroupState. A method that refuses raises QueueError;
    GroupCore.handle keeps what a method changed only once it returned."""
