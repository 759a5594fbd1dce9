"""NodeCore's decisions one at a time (the property machine in
tests/node_machine.py throws random traffic at the same door)."""

from __future__ import annotations

import pytest

from timeshare.models import (
    NO_DEVICE_ROOM,
    ActionName,
    BackendAction,
    FailureKind,
    NodeMove,
    SwitchInput,
)
from timeshare.node import commands as cmd
from timeshare.node import events as ev
from timeshare.node.core import SUPERSEDED, NodeCore
from timeshare.node.state import GroupHere, JobHere, NodeState


def switch(admit: str, evict: list[str], plan: int = 1, node: str = "n") -> ev.SwitchAsked:
    move = NodeMove(node=node, admit=admit, evict=evict)
    return ev.SwitchAsked(SwitchInput(group="g", epoch=plan, move=move, plan=plan), False)


def done(job: str, action: ActionName) -> ev.ActionDone:
    return ev.ActionDone("g", BackendAction(job=job, action=action))


def test_a_switch_for_another_node_or_an_older_plan_is_refused_for_good() -> None:
    core = NodeCore(NodeState(node="n"))
    (refused,) = core.handle(switch("a", [], node="m"))
    assert isinstance(refused, cmd.Refuse) and refused.non_retryable
    core.handle(switch("a", [], plan=5))
    (superseded,) = core.handle(switch("b", ["a"], plan=4))
    assert isinstance(superseded, cmd.Refuse) and superseded.non_retryable
    assert (superseded.type, superseded.message) == (
        SUPERSEDED,
        "switch plan 4 of group 'g' was superseded by plan 5",
    )
    assert core.state.groups["g"].latest_plan == 5


def test_a_switch_reads_the_device_then_moves_one_job_at_a_time() -> None:
    core = NodeCore(NodeState(node="n"))
    assert core.handle(switch("b", ["a"]))[-1] == cmd.ReadRoom("g", "b", shared=False)
    # The backend also sees c, which the scheduler forgot: it leaves too.
    assert core.handle(ev.RoomRead("g", ["a", "c"])) == [cmd.Act("g", "a", "checkpoint")]
    assert core.handle(done("a", "checkpoint")) == [cmd.Act("g", "c", "checkpoint")]
    assert core.handle(done("c", "noop")) == [cmd.Act("g", "b", "restore")]
    (answer,) = core.handle(done("b", "restore"))
    assert answer == cmd.AnswerSwitch("g", "b", ["a", "c"], [], ["a", "c"])
    assert core.admitted("g") == "b"


@pytest.mark.parametrize(
    ("error", "step", "refused"),
    [
        ("JobFailed", "checkpoint", cmd.Refuse(FailureKind.JOB_FAILED, "x", ("a",), True)),
        (
            "NoDeviceRoom",
            "restore",
            cmd.Refuse(FailureKind.RESTORE, "x", ("a", NO_DEVICE_ROOM), True),
        ),
        ("HookFailed", "checkpoint", cmd.Refuse(FailureKind.HOOK, "x", ("a",))),
        ("HookFailed", "restore", cmd.Refuse(FailureKind.RESTORE, "x")),
        ("BackendError", "lock", cmd.Refuse(FailureKind.CHECKPOINT, "x", ("a",))),
        ("BackendError", "restore", cmd.Refuse(FailureKind.RESTORE, "x", ("a",))),
    ],
)
def test_a_failed_step_is_refused_with_its_kind(
    error: str, step: cmd.Step, refused: cmd.Refuse
) -> None:
    core = NodeCore(NodeState(node="n"))
    core.handle(switch("b", ["a"]))
    core.handle(ev.RoomRead("g", ["a"]))
    assert core.handle(ev.ActionFailed("g", "a", step, ev.Failure(error, "x"))) == [refused]
    assert core.state.groups["g"].switch is None and core.admitted("g") == ""


def test_host_memory_is_held_against_every_checkpoint_under_way() -> None:
    core = NodeCore(NodeState(node="n"))
    assert core.handle(ev.HostAsked("g1", "a", 64, available=100)) == [
        cmd.ReserveHost("g1", "a", 64)
    ]
    (refused,) = core.handle(ev.HostAsked("g2", "b", 64, available=100, parked="g1/x 1 GiB"))
    assert isinstance(refused, cmd.Refuse) and "held by checkpoints under way" in refused.message
    assert "parked here already: g1/x 1 GiB" in refused.message
    assert core.handle(ev.HostDone("g1", "a")) == [cmd.FreeHost("g1", "a", 64)]
    (limited,) = core.handle(ev.HostAsked("g2", "b", 64, 100, room=32, limit="/pod"))
    assert isinstance(limited, cmd.Refuse) and "cgroup /pod" in limited.message
    assert core.state.host_held == {}


def test_a_restart_keeps_what_was_released_and_relearns_the_rest() -> None:
    core = NodeCore(NodeState(node="n"))
    core.handle(switch("a", []))
    core.handle(ev.RoomRead("g", []))
    core.handle(done("a", "restore"))
    core.handle(ev.ReleaseAsked("g", "a", incarnation=1))
    saved = core.state.durable()
    again = NodeCore(NodeState.restarted("n", saved, frozenset({("g", "old")})))
    assert again.released("g", "a") and again.released("g", "old")
    assert again.admitted("g") == "" and again.state.groups.get("g") is None


def _record_with_two_groups() -> NodeState:
    return NodeState(
        node="n",
        groups={"g": GroupHere(admitted="a", gpus=[0], parked_leavers=["x"]), "h": GroupHere()},
        jobs={"g/a": JobHere(member_incarnation=2), "h/b": JobHere(last_ran=3)},
    )


def test_an_event_changes_a_copy_of_what_it_touches_and_shares_the_rest() -> None:
    """The draft shares untouched entries with the record: the record an
    event began from is never changed in place."""
    core = NodeCore(_record_with_two_groups())
    record = core.state
    core.handle(ev.GpusClaimed("g", [1], node="n"))
    assert record.groups["g"].gpus == [0] and core.state.groups["g"].gpus == [1]
    assert core.state.groups["h"] is record.groups["h"]  # not copied: nothing changed it
    assert core.state.jobs["h/b"] is record.jobs["h/b"]


def test_a_handler_that_fails_leaves_the_record_exactly_as_it_was() -> None:
    core = NodeCore(_record_with_two_groups())
    before = core.state.model_copy(deep=True)

    def changes_then_fails(event: ev.GpusClaimed) -> list[cmd.Command]:
        core._group("g").admitted = "b"
        core._group("g").parked_leavers.append("y")
        core._job("g", "a").released = True
        core._job("g", "new").last_ran = 9
        core._group("new")
        core.state.host_held["g/a"] = 1
        core.state.clock += 1
        raise RuntimeError("a handler's bug")

    core._handlers[ev.GpusClaimed] = changes_then_fails
    with pytest.raises(RuntimeError):
        core.handle(ev.GpusClaimed("g", [1], node="n"))
    assert core.state == before
