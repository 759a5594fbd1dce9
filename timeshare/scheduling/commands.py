"""What the scheduling core decides: the commands GroupCore.handle returns,
for the group workflow to carry out in order (each in one place: the
workflow's executor matches every type here, and mypy fails it where one is
left out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from timeshare.scheduling.state import SwitchPlan


@dataclass(frozen=True)
class Reply:
    """The answer to the message handled."""

    value: Any


@dataclass(frozen=True)
class Log:
    message: str
    warning: bool = False


@dataclass(frozen=True)
class MarkPatch:
    """The decision that follows rests on a scheduler change (``patch`` is
    its name): the workflow records Temporal's marker of that change, so
    that a history from before the change is told apart."""

    patch: str


class Release(NamedTuple):
    """Job ``job``, which left, on ``node``. ``incarnation`` names the
    membership that ended: the job may join again while its agent still
    releases it, and a release must not end, or act on, a later one."""

    job: str
    node: str
    incarnation: int = 0


@dataclass(frozen=True)
class StartReleases:
    """Ask these agents to let the processes of a job that left go, in the
    background; each tells the core with ReleaseEnded."""

    releases: tuple[Release, ...]


@dataclass(frozen=True)
class Wake:
    """When the group must next look at itself (a Tick): ``at_once``, as
    soon as the workflow can (something changed, or a switch, a release or
    continue-as-new is due); else at ``at`` (None: only when told something).
    The latest Wake replaces the ones before it."""

    at: float | None
    at_once: bool = False


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
class ContinueAsNew:
    """Carry the whole state into a new run of the workflow."""


Command = (
    Reply | Log | MarkPatch | StartReleases | Wake | AttemptSwitch | PauseSwitch | ContinueAsNew
)  # fmt: skip
