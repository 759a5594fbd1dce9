"""The healer's reading of a real stuck group's history: the one a chaos run
saved when temporalio's core could not replay what it had written
(tests/histories/sdk-bugs/, docs/reliability.md). Replayed with the
scheduler's code it stops part-way; the state rebuilt from the replayed part
and the facts after it holds the job the history told its grant (g1-j2,
epoch 2) and queues the job whose acquire it accepted after (g1-j1)."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory

from timeshare.scheduling import events as ev
from timeshare.scheduling import healing
from timeshare.scheduling.base import UNKNOWN_RESIDENT
from timeshare.scheduling.group_core import GroupCore
from timeshare.workers.scheduler.data_converter import DATA_CONVERTER
from timeshare.workers.scheduler.healing.history_facts import facts_after, read_run
from timeshare.workers.scheduler.healing.replayed_state import replayed_state
from timeshare.workers.scheduler.healing.start_state import start_state
from timeshare.workflows.group import GroupWorkflow

HISTORY = Path(__file__).parent.parent / "histories" / "sdk-bugs" / "cold-start-update-order.json"
# The task the SDK's core cannot replay completed at this event.
FAILING_TASK_COMPLETED = 139


def history() -> WorkflowHistory:
    return WorkflowHistory.from_json("sdk-bug", json.loads(HISTORY.read_text()))


async def test_the_stuck_groups_history_replays_to_a_task_before_the_failing_one() -> None:
    replayed = await replayed_state(history(), [GroupWorkflow], DATA_CONVERTER)
    assert "Nondeterminism" in replayed.failure
    assert replayed.state is not None and 0 < replayed.task_started < FAILING_TASK_COMPLETED
    # The replayed state is before the grant: a switch to g1-j2 is under way.
    assert replayed.state.turn is None and replayed.state.switching is not None
    assert replayed.state.switching.waiter.job == "g1-j2"


async def test_the_rebuilt_group_holds_what_its_jobs_were_told() -> None:
    whole = history()
    replayed = await replayed_state(whole, [GroupWorkflow], DATA_CONVERTER)
    assert replayed.state is not None
    record = read_run(whole.events, DATA_CONVERTER.payload_converter)
    facts, touched = facts_after(whole.events, replayed.task_started + 1, record, 0.0)
    assert [fact.kind for fact in facts] == ["granted", "asked"]
    rebuild = healing.HealInput(
        cause="nondeterminism", failed_run_id="r", rebuilt_from="the replay", facts=facts,
        plans_sent=record.plans_sent, epochs_sent=record.epochs_sent,
        incarnations_sent=record.incarnations_sent, touched_nodes=touched,
    )  # fmt: skip
    core = GroupCore(replayed.state)
    core.handle(ev.Healed(rebuild), facts[-1].at + 1)
    state = core.state
    assert state.turn is not None and (state.turn.job, state.turn.epoch) == ("g1-j2", 2)
    assert [waiter.job for waiter in state.queue] == ["g1-j1"]
    assert {node: state.resident[node] for node in state.jobs["g1-j2"].nodes} == {
        node: "g1-j2" for node in state.jobs["g1-j2"].nodes
    }
    others = set(touched) - set(state.jobs["g1-j2"].nodes)
    assert others and all(state.resident[node] == UNKNOWN_RESIDENT for node in others)
    assert state.plans >= record.plans_sent and state.epoch >= record.epochs_sent


async def test_a_run_that_fails_its_first_task_starts_from_its_input() -> None:
    """Where not even the first task replays: the run's input, here a new
    group's, with the rules its first task chose (read from its markers,
    the same the replay chose)."""
    whole = history()
    state = start_state(whole.events, DATA_CONVERTER.payload_converter)
    replayed = await replayed_state(whole, [GroupWorkflow], DATA_CONVERTER)
    assert replayed.state is not None
    assert (state.group, state.jobs, state.turn) == ("chaos-1", {}, None)
    assert state.rules == replayed.state.rules and state.policy == replayed.state.policy
