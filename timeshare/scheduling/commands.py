"""What the scheduling core decides: the commands GroupCore.handle returns,
for the group workflow to carry out in order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from timeshare.scheduling.state import SwitchPlan


@dataclass(frozen=True)
class Reply:
    """The answer to the message handled; ``changed``: the state changed, so
    the group must look at itself again (a heartbeat changes no deadline)."""

    value: Any
    changed: bool = True


@dataclass(frozen=True)
class Log:
    message: str
    warning: bool = False


@dataclass(frozen=True)
class RuleUsed:
    """The decision that follows comes from a rule a scheduler change brought
    in (its name is that change's): the workflow records it, so that a
    history from before the change is told apart."""

    rule: str


@dataclass(frozen=True)
class StartReleases:
    """Ask the agents of every job that left to let its processes go."""


@dataclass(frozen=True)
class AttemptSwitch:
    """Run an attempt of the planned switch: stop the jobs that leave several
    nodes on all of them, then one move per node, in parallel; then tell the
    core with SwitchAttempted."""

    plan: SwitchPlan


@dataclass(frozen=True)
class PauseSwitch:
    """Wait this long before the next attempt, or less if the plan no longer
    stands; then tell the core with SwitchPaused."""

    seconds: float


@dataclass(frozen=True)
class SwitchOver:
    """The switch ended: it went through, was given up, or was set aside."""


@dataclass(frozen=True)
class ContinueAsNew:
    """Carry the whole state into a new run of the workflow."""


Command = (
    Reply | Log | RuleUsed | StartReleases | AttemptSwitch | PauseSwitch | SwitchOver
    | ContinueAsNew
)  # fmt: skip
