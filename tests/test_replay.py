"""Recorded GroupWorkflow histories (tests/histories/) must replay on the
current workflow code: a change that would break running groups fails here
and needs Temporal's patching (workflow.patched) instead.

Set TIMESHARE_RECORD_HISTORIES=1 to record a fresh history of the scenario
below next to the committed ones."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.conftest import SimNodes
from tests.groups import acquire, eventually, group_on_one_node, heartbeat, release
from timeshare.models import DrainInput, EvictInput, GroupPolicy, PauseInput
from timeshare.workflows.group import GroupWorkflow
from timeshare.workflows.sandbox import workflow_runner

HISTORIES = Path(__file__).parent / "histories"


def recorded() -> list[Path]:
    return sorted(HISTORIES.glob("*.json"))


@pytest.mark.parametrize("path", recorded(), ids=lambda p: p.stem)
async def test_recorded_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(
        workflows=[GroupWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    )
    await replayer.replay_workflow(history)


def test_histories_are_committed() -> None:
    assert recorded(), "no recorded histories under tests/histories"


async def test_a_fresh_history_replays(client: Client, sim_nodes: SimNodes, unique: str) -> None:
    """Every kind of message and timer the workflow handles, in one history."""
    policy = GroupPolicy(lease_seconds=3, max_turn_seconds=0.5, preempt_grace_seconds=0.3)
    handle, backend = await group_on_one_node(client, sim_nodes, unique, ("a", "b", "c"), policy)
    first = await acquire(handle, "a")
    waiting = asyncio.create_task(acquire(handle, "b"))
    await asyncio.sleep(1.0)  # a is preempted; b is granted
    second = await waiting
    await heartbeat(handle, "a")
    await release(handle, "b", second.epoch)
    await heartbeat(handle, "a")
    await release(handle, "a", first.epoch)
    await handle.execute_update(GroupWorkflow.pause, PauseInput(paused=True))
    await handle.execute_update(GroupWorkflow.pause, PauseInput(paused=False))
    await handle.execute_update(GroupWorkflow.drain, DrainInput(node="other", drained=True))
    backend.inject_failure("restore", "c", times=10)
    with pytest.raises(WorkflowUpdateFailedError) as failure:
        await acquire(handle, "c")
    assert "could not be restored" in str(failure.value.cause)
    await handle.execute_update(GroupWorkflow.evict, EvictInput(job="c", reason="test"))
    status = await eventually(handle, lambda s: s.jobs == [])  # a's and b's leases run out
    assert status.preemptions == 1
    history = await handle.fetch_history()
    replayer = Replayer(
        workflows=[GroupWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    )
    await replayer.replay_workflow(history)
    if os.environ.get("TIMESHARE_RECORD_HISTORIES") == "1":
        HISTORIES.mkdir(exist_ok=True)
        (HISTORIES / "group-every-message.json").write_text(history.to_json())
