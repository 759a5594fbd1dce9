"""GroupWorkflow on a real Temporal dev server, with in-process scheduler and
sim node-agent workers."""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import timedelta

import pytest
from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
)
from temporalio.worker import Replayer

from tests.conftest import SimNodes
from tests.groups import (
    Handle,
    acquire,
    eventually,
    group_on_one_node,
    join,
    refusal_type,
    yield_turn,
)
from tests.integration.test_replay import HISTORIES
from tests.polling import wait_until_async
from timeshare.names import SCHEDULER_TASK_QUEUE
from timeshare.scheduling import events as ev
from timeshare.workers.scheduler.data_converter import DATA_CONVERTER
from timeshare.workflows.group import ACQUIRE_WAIT_SLICE_SECONDS, GroupWorkflow
from timeshare.workflows.registry import NodeRegistryWorkflow
from timeshare.workflows.sandbox import workflow_runner


async def test_handover_checkpoints_before_it_grants(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, backend = await group_on_one_node(client, sim_nodes, unique)
    first = await acquire(handle, "a")
    waiting = asyncio.create_task(acquire(handle, "b"))
    await eventually(handle, lambda s: s.queue == ["b"])
    assert not waiting.done()
    await yield_turn(handle, "a", first.epoch)
    second = await waiting

    assert (first.epoch, second.epoch) == (1, 2)
    assert second.switch_seconds > 0
    checkpoint = next(e for e in backend.events if e["event"] == "checkpoint")
    assert checkpoint["job"] == "a"
    assert checkpoint["end"] <= second.granted_at + 0.05  # server and worker share a clock
    assert backend.resident(f"g-{unique}") == ["b"]
    status = await handle.query(GroupWorkflow.status)
    assert (status.holder, status.resident, status.switches) == ("b", {f"n-{unique}": "b"}, 2)


async def test_reacquire_with_nobody_waiting_touches_no_node(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, backend = await group_on_one_node(client, sim_nodes, unique, jobs=("a",))
    for _ in range(3):
        grant = await acquire(handle, "a")
        await yield_turn(handle, "a", grant.epoch)
    actions = [e["event"] for e in backend.events]
    assert actions == ["restore"]  # the first admission only
    assert grant.epoch == 3 and grant.switch_seconds == 0.0


async def test_more_waiters_than_temporal_default_update_limit(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    node = f"n-{unique}"
    await sim_nodes.start(node, state_bytes=0)
    group = f"g-{unique}"
    jobs = [f"j{i}" for i in range(16)]
    handles = [await join(client, group, job, [node]) for job in jobs]
    holder = await acquire(handles[0], jobs[0])
    waiters = [
        asyncio.create_task(acquire(h, j)) for h, j in zip(handles[1:], jobs[1:], strict=True)
    ]
    await eventually(handles[0], lambda s: len(s.queue) == len(jobs) - 1, seconds=60)
    epoch, job = holder.epoch, jobs[0]
    for _ in waiters:
        await yield_turn(handles[0], job, epoch)
        done, _ = await asyncio.wait(
            [w for w in waiters if not w.done()], return_when=asyncio.FIRST_COMPLETED
        )
        grant = done.pop().result()
        epoch, job = grant.epoch, grant.job
    assert epoch == len(jobs)


async def test_acquire_timeout_leaves_the_queue(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, _ = await group_on_one_node(client, sim_nodes, unique)
    await acquire(handle, "a")
    with pytest.raises(WorkflowUpdateFailedError) as failed:
        await acquire(handle, "b", timeout=0.5)
    assert refusal_type(failed.value) == "DEADLINE_EXCEEDED"
    status = await handle.query(GroupWorkflow.status)
    assert status.queue == [] and status.holder == "a"


async def test_refused_messages_leave_the_group_unchanged(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, _ = await group_on_one_node(client, sim_nodes, unique, jobs=("a",))
    grant = await acquire(handle, "a")
    before = await handle.query(GroupWorkflow.status)
    wrong: list[tuple[str, ev.Message]] = [
        ("yield", ev.Yield(job="a", token_hash="hash-a", epoch=99)),
        ("yield", ev.Yield(job="a", token_hash="nope", epoch=grant.epoch)),
        ("heartbeat", ev.Heartbeat(job="ghost", token_hash="x")),
        ("leave", ev.Leave(job="a", token_hash="nope")),
    ]
    codes = []
    for update, message in wrong:
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(update, message)
        codes.append(refusal_type(refused.value))
    assert codes == ["FAILED_PRECONDITION", "UNAUTHENTICATED", "NOT_FOUND", "UNAUTHENTICATED"]
    assert await handle.query(GroupWorkflow.status) == before


async def test_history_replays_deterministically(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    handle, _ = await group_on_one_node(client, sim_nodes, unique)
    for job in ("a", "b", "a"):
        grant = await acquire(handle, job)
        await yield_turn(handle, job, grant.epoch)
    history = await handle.fetch_history()
    replayer = Replayer(
        workflows=[GroupWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=workflow_runner(),
    )
    await replayer.replay_workflow(history)


async def test_node_registry_notices_a_silent_node(client: Client, scheduler: object) -> None:
    from timeshare.models import NodeInfo
    from timeshare.workflows.registry import NodeRegistryInput

    handle = await client.start_workflow(
        NodeRegistryWorkflow.run,
        NodeRegistryInput(liveness_seconds=1.0),
        id=f"registry-{uuid.uuid4().hex[:8]}",
        task_queue=SCHEDULER_TASK_QUEUE,
        start_signal="announce",
        start_signal_args=[NodeInfo(node="n1", backend="sim", simulated=True)],
    )
    nodes = await handle.query(NodeRegistryWorkflow.nodes)
    assert [(n.node, n.alive) for n in nodes] == [("n1", True)]

    async def silent() -> bool:
        return not (await handle.query(NodeRegistryWorkflow.nodes))[0].alive

    await wait_until_async(silent, "n1 to be marked silent", every=0.2)
    await handle.terminate()


async def test_a_job_on_two_nodes_is_stopped_on_both_before_either_checkpoints(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, n1, n2 = f"g-{unique}", f"n1-{unique}", f"n2-{unique}"
    backends = [await sim_nodes.start(node) for node in (n1, n2)]
    a = await join(client, group, "a", [n1, n2])
    b = await join(client, group, "b", [n2])
    first = await acquire(a, "a")
    # n2's first checkpoint of a fails: were a not stopped everywhere first,
    # n1 would checkpoint a while a's rank on n2 still ran.
    backends[1].inject_failure("checkpoint", "a", times=1)
    waiting = asyncio.create_task(acquire(b, "b"))
    await eventually(a, lambda s: s.queue == ["b"])
    await yield_turn(a, "a", first.epoch)
    await waiting
    events = [e for backend in backends for e in backend.events if e["job"] == "a"]
    stopped = [e["end"] for e in events if e["event"] == "running"]
    checkpoints = [e["start"] for e in events if e["event"] == "checkpoint"]
    assert len(stopped) == len(checkpoints) == 2  # a left both nodes, though b needs n2 only
    assert max(stopped) <= min(checkpoints)
    assert [backend.resident(group) for backend in backends] == [[], ["b"]]

    again = asyncio.create_task(acquire(a, "a"))
    await eventually(a, lambda s: s.queue == ["a"])
    await yield_turn(b, "b", first.epoch + 1)
    await again
    assert [backend.running(group) for backend in backends] == [["a"], ["a"]]
    history = await a.fetch_history()
    replayer = Replayer(
        workflows=[GroupWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=workflow_runner(),
    )
    await replayer.replay_workflow(history)
    if os.environ.get("TIMESHARE_RECORD_HISTORIES") == "1":  # see tests/integration/test_replay.py
        (HISTORIES / "group-two-nodes.json").write_text(history.to_json())


async def test_a_waiting_acquire_starts_no_timer_of_its_own(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """Its wait slice ends by the group's one timer: no 60 s timer started
    and cancelled per waiting acquire."""
    handle, _ = await group_on_one_node(client, sim_nodes, unique)
    first = await acquire(handle, "a")
    waiting = asyncio.create_task(acquire(handle, "b"))
    await eventually(handle, lambda s: s.queue == ["b"])
    await yield_turn(handle, "a", first.epoch)
    await waiting
    timers = await started_timers(handle)
    assert timers and timedelta(seconds=ACQUIRE_WAIT_SLICE_SECONDS) not in timers


async def started_timers(handle: Handle) -> list[timedelta]:
    """How long each timer the group started was to run, in history order."""
    return [
        event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        async for event in handle.fetch_history_events()
        if event.HasField("timer_started_event_attributes")
    ]


async def test_a_grant_arms_no_timer_for_the_wait_it_ended(
    client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """The first acquire waits for its switch; once granted, its handler
    resumes later in the same workflow task. The group's timer must not be
    armed for that settled wait slice meanwhile (it was, at every grant to an
    idle group, and cancelled when the next job asked)."""
    handle, _ = await group_on_one_node(client, sim_nodes, unique)
    grant = await acquire(handle, "a")
    assert grant.switch_seconds > 0  # it waited for a switch
    slice_seconds = timedelta(seconds=ACQUIRE_WAIT_SLICE_SECONDS)
    timers = await started_timers(handle)
    assert timers
    assert not [t for t in timers if slice_seconds - timedelta(seconds=5) < t <= slice_seconds]
    await yield_turn(handle, "a", grant.epoch)
