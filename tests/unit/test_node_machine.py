"""The node's core under random traffic (tests/node_machine.py), and the
same machine run on cores broken on purpose: each broken rule must be
found, so that a passing run means the invariants hold, not that the
machine cannot see them fail."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.node_machine import NodeMachine
from timeshare.node import commands as cmd
from timeshare.node import events as ev
from timeshare.node.core import NodeCore
from timeshare.node.room import RoomPlan

TestNodeMachine = NodeMachine.TestCase
TestNodeMachine.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)


class LateReleasesLetGo(NodeCore):
    """Forgets that a release may come after its job joined again."""

    def _release_asked(self, event: ev.ReleaseAsked) -> list[cmd.Command]:
        return super()._release_asked(ev.ReleaseAsked(event.group, event.job, event.gpus, 0))


class KeepsEveryoneResident(NodeCore):
    """Keeps every other job on the device, locked, whether the admitted one fits or not."""

    def _plan(self, group: str, admit: str, others: list[str], room: RoomPlan) -> list[cmd.Command]:
        keep = sorted(set(room.keep) | set(room.evict)) if admit else room.keep
        evict = [] if admit else room.evict
        return super()._plan(group, admit, others, RoomPlan(evict=evict, keep=keep))


class ForgetsWhatWasReleased(NodeCore):
    """Saves nothing of what a release did: after a restart a released job
    is a member again."""

    def _release_asked(self, event: ev.ReleaseAsked) -> list[cmd.Command]:
        commands = super()._release_asked(event)
        return [command for command in commands if not isinstance(command, cmd.Persist)]

    def _processes_released(self, event: ev.ProcessesReleased) -> list[cmd.Command]:
        commands = super()._processes_released(event)
        return [command for command in commands if not isinstance(command, cmd.Persist)]


class LeaversLetGoEvenWhenBack(NodeCore):
    """Brings back the jobs that left while parked, even one that joined
    again since (the machine found this in the agent as it was)."""

    def _member_again(self, group: str, job: str) -> None:
        self.state.job(group, job).released = False


class SwitchesStopHalfWay(NodeCore):
    """Never answers a switch that moved nobody in."""

    def _next_step(self, group: str) -> list[cmd.Command]:
        commands = super()._next_step(group)
        return [c for c in commands if not (isinstance(c, cmd.AnswerSwitch) and not c.admit)]


BROKEN = [
    LateReleasesLetGo,
    KeepsEveryoneResident,
    ForgetsWhatWasReleased,
    LeaversLetGoEvenWhenBack,
    SwitchesStopHalfWay,
]


@pytest.mark.parametrize("broken", BROKEN, ids=lambda kind: kind.__name__)
def test_the_machine_finds_a_core_broken_on_purpose(broken: type[NodeCore]) -> None:
    class Broken(NodeMachine):
        core_kind = broken

    found = settings(
        max_examples=2000,
        stateful_step_count=60,
        deadline=None,
        derandomize=True,
        database=None,
        # Found is enough: no shrinking to the smallest case.
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    failed: list[BaseException] = []
    try:
        run_state_machine_as_test(Broken, settings=found)
    except* AssertionError as failures:  # one, or several told apart
        failed += failures.exceptions
    assert failed, f"the machine ran {broken.__name__} and found nothing wrong"
