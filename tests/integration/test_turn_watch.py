"""What a job hears during its turn, and what its lease costs: the turn's watch
keeps Turn.should_yield current (blocking client: on_should_yield; asyncio:
yield_requested), a holder that others wait for renews its lease and keeps
its turn, and a job whose messages keep it alive sends no heartbeat at all.
Real gateway, scheduler and Temporal; sim nodes."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import grpc
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.worker import Worker

import timeshare
import timeshare.aio
from tests.conftest import SimNodes
from tests.groups import acquire, group_on_one_node, yield_turn
from tests.polling import wait_until, wait_until_async
from timeshare.models import Grant, GroupPolicy, PublishedTurn
from timeshare.names import SCHEDULER_TASK_QUEUE, group_workflow_id
from timeshare.scheduling import events as ev
from timeshare.scheduling import watch
from timeshare.scheduling.rules import RULES_POLICIES
from timeshare.scheduling.state import GroupState, StoredPolicy
from timeshare.scheduling.watch import MEMO_KEY, WatchRecord
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc
from timeshare.workers.gateway import turn_watch
from timeshare.workers.gateway.group_client import acquire_turn
from timeshare.workers.gateway.turn_watch import GroupFacts, GroupPoller, TurnWatches
from timeshare.workflows.group import GroupInput, GroupWorkflow
from timeshare.workflows.visibility import HOLDER
from timeshare.workflows.watch_memo import BACKFILL_YIELD_AT_MEMO, WATCH_POLL_MEMO, YIELD_EPOCH_MEMO


async def heartbeats_in_history(client: Client, group: str) -> int:
    """How many heartbeat updates the group's workflow has taken."""
    history = await client.get_workflow_handle(group_workflow_id(group)).fetch_history()
    accepted = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    return sum(
        1
        for event in history.events
        if event.event_type == accepted
        and event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        == "heartbeat"
    )


async def test_the_blocking_client_hears_should_yield_and_calls_back(
    gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start(node)
    policy = GroupPolicy(max_turn_seconds=0.5, preempt_grace_seconds=60)
    heard: list[int] = []

    def holder_and_waiter() -> None:
        with timeshare.connect(gateway) as client:
            a = client.join(group, "a", nodes=[node], policy=policy)
            b = client.join(group, "b", nodes=[node])
            a.on_should_yield(lambda turn: heard.append(turn.epoch))
            turn = a.acquire(phase="rollout")
            assert not turn.should_yield and turn.phase == "rollout"

            def wait_for_a_turn() -> None:
                with b.turn():
                    pass

            waiter = threading.Thread(target=wait_for_a_turn)
            waiter.start()
            wait_until(lambda: turn.should_yield, "a's turn to be asked to yield")
            assert heard == [turn.epoch]
            a.yield_()
            waiter.join(timeout=60)
            assert not waiter.is_alive()

    await asyncio.to_thread(holder_and_waiter)


async def test_the_asyncio_client_sets_yield_requested_for_a_higher_priority_waiter(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start(node)
    policy = GroupPolicy(preempt_lower_after_seconds=60)
    batch = await api.join(group, "batch", nodes=[node], policy=policy)
    trainer = await api.join(group, "trainer", nodes=[node], priority=5)
    turn = await batch.acquire()
    assert not batch.yield_requested.is_set()
    waiting = asyncio.create_task(trainer.acquire())
    await asyncio.wait_for(batch.yield_requested.wait(), 30)
    assert turn.should_yield
    status = await api.get_group(group)
    assert status.yield_requested and status.holder == "batch"
    await batch.yield_()
    granted = await waiting
    assert not trainer.yield_requested.is_set() and not granted.should_yield
    await trainer.yield_()


async def test_a_holder_others_wait_for_renews_and_keeps_its_turn(
    api: timeshare.aio.Client, client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    """lease 2 s, idle lease 60 s: only the watch's "others wait" makes the
    holder renew within the 2 s; without it the holder would be evicted."""
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start(node)
    policy = GroupPolicy(lease_seconds=2, idle_lease_seconds=60)
    a = await api.join(group, "a", nodes=[node], policy=policy)
    b = await api.join(group, "b", nodes=[node])
    turn = await a.acquire()
    waiting = asyncio.create_task(b.acquire())
    await asyncio.sleep(6)  # a holds on, three leases long, while b waits
    status = await api.get_group(group)
    assert status.holder == "a" and status.epoch == turn.epoch, status
    assert await heartbeats_in_history(client, group) >= 2
    await a.yield_()
    await waiting
    await b.yield_()


async def test_a_job_taking_turns_sends_no_heartbeat_and_an_idle_one_renews(
    api: timeshare.aio.Client, client: Client, sim_nodes: SimNodes, unique: str
) -> None:
    busy_group, idle_group, node = f"busy-{unique}", f"idle-{unique}", f"n-{unique}"
    await sim_nodes.start(node)
    policy = GroupPolicy(lease_seconds=3, idle_lease_seconds=3)  # renewals due every 1 s
    # Two groups on one node: on GPUs of their own (a GPU is one group's at a time).
    busy_policy = policy.model_copy(update={"gpus": [0]})
    idle_policy = policy.model_copy(update={"gpus": [1]})
    busy = await api.join(busy_group, "busy", nodes=[node], policy=busy_policy)
    idle = await api.join(idle_group, "idle", nodes=[node], policy=idle_policy)
    loop = asyncio.get_running_loop()
    until = loop.time() + 5
    while loop.time() < until:  # every acquire and yield renews the lease
        async with busy.turn():
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.2)
    assert await heartbeats_in_history(client, busy_group) == 0
    renewed = await heartbeats_in_history(client, idle_group)
    assert renewed >= 3
    assert [j.job for j in (await api.get_group(idle_group)).jobs] == ["idle"]
    await idle.leave()
    await busy.leave()


async def test_watch_refusals_are_clear(gateway: str, unique: str) -> None:
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = pb_grpc.TimeSlicerStub(channel)
        cases = [
            (pb.WatchTurnRequest(group="Bad Group", job="a"), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.WatchTurnRequest(group=f"none-{unique}", job="a"), grpc.StatusCode.NOT_FOUND),
        ]
        for request, code in cases:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in stub.WatchTurn(request):
                    pass
            assert refused.value.code() == code, refused.value.details()
            assert refused.value.details()


async def test_a_watch_notices_when_the_turn_is_no_longer_held(
    api: timeshare.aio.Client, gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start(node)
    a = await api.join(group, "a", nodes=[node])
    turn = await a.acquire()
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = pb_grpc.TimeSlicerStub(channel)
        stream = stub.WatchTurn(pb.WatchTurnRequest(group=group, job="a", epoch=turn.epoch))
        first = await stream.read()
        assert isinstance(first, pb.TurnNotice) and first.holding
        await a.yield_()

        async def released() -> bool:
            notice = await stream.read()
            return isinstance(notice, pb.TurnNotice) and not notice.holding

        await wait_until_async(released, "the watch to see the turn given back", every=0.0)
        stream.cancel()
    await a.leave()


async def test_a_watch_that_starts_its_groups_poller_shares_its_first_read(
    api: timeshare.aio.Client,
    client: Client,
    sim_nodes: SimNodes,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One describe opens the watch and starts the poller, not two; a second
    watch of the same group still reads afresh (the poller may be mid-read)."""
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start(node)
    a = await api.join(group, "a", nodes=[node])
    b = await api.join(group, "b", nodes=[node])
    turn = await a.acquire()
    readers = counted_reads(monkeypatch)
    # This test's own watches (the gateway serving `a` has pollers of its own),
    # with no periodic read within the test: only the ones a watch makes.
    watches = quiet_watches(client, group)
    first = watches.notices(group, "a", turn.epoch)
    second = watches.notices(group, "b", 0)
    try:
        notice = await anext(first)
        assert notice.holding and notice.epoch == turn.epoch
        ours = watches._pollers[group]
        assert readers.count(ours) == 1
        assert not (await anext(second)).holding
        assert readers.count(ours) == 2
    finally:
        for watch in (second, first):
            await watch.aclose()
    await a.yield_()
    await a.leave()
    await b.leave()


async def test_a_watch_of_a_turn_granted_here_begins_from_what_its_group_published(
    client: Client, sim_nodes: SimNodes, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter's grant carries what its group published with it (queue
    depth, watch record): the watch of that turn on the gateway that
    delivered it says what a read would say, without reading the group."""
    handle, _ = await group_on_one_node(client, sim_nodes, unique, ("a", "b", "c"))
    group = f"g-{unique}"
    held = await acquire(handle, "a")
    published: list[tuple[Grant, PublishedTurn]] = []

    def ask(job: str) -> ev.Acquire:
        return ev.Acquire(job=job, token_hash=f"hash-{job}", request_id=uuid.uuid4().hex)

    b_waits = asyncio.create_task(
        acquire_turn(handle, ask("b"), on_published=lambda *said: published.append(said))
    )
    await wait_until_async(lambda: queue_of(handle, ["b"]), "b waits")
    c_waits = asyncio.create_task(acquire(handle, "c"))
    await wait_until_async(lambda: queue_of(handle, ["b", "c"]), "b and c wait")
    await yield_turn(handle, "a", held.epoch)
    granted = await b_waits
    [(grant, facts)] = published
    assert grant == granted and facts.waiting == 1  # c still waits
    real_read = GroupPoller.read
    readers = counted_reads(monkeypatch)
    watches = quiet_watches(client, group)
    watches.granted(group, grant, facts)
    watch = watches.notices(group, "b", grant.told_epoch)
    try:
        first = await anext(watch)
        assert not readers  # without a read of the group
        read = await real_read(watches._pollers[group])
        assert first == read.notice("b", grant.told_epoch, False, time.time())
        assert first.holding and first.waiting == 1
    finally:
        await watch.aclose()
    await yield_turn(handle, "b", grant.told_epoch)
    await c_waits


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[GroupPoller]:
    """The pollers of each read of a group from now on, one entry per read."""
    readers: list[GroupPoller] = []
    real_read = GroupPoller.read

    async def counted(poller: GroupPoller) -> GroupFacts:
        readers.append(poller)
        return await real_read(poller)

    monkeypatch.setattr(GroupPoller, "read", counted)
    return readers


def quiet_watches(client: Client, group: str) -> TurnWatches:
    """Watches whose poller of ``group`` makes no periodic read within a test."""
    watches = TurnWatches(client)
    watches._intervals[group] = 60.0
    return watches


async def queue_of(handle: WorkflowHandle[GroupWorkflow, None], jobs: list[str]) -> bool:
    return (await handle.query(GroupWorkflow.status)).queue == jobs


async def test_a_watch_learns_how_often_to_poll_from_its_groups_record(
    api: timeshare.aio.Client,
    client: Client,
    sim_nodes: SimNodes,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a query (a workflow task on the scheduler per group and
    gateway): from the record its creator set, or, for a group started
    without it, the record its run publishes; from the memo key a run of
    an older scheduler was created with."""
    group, node = f"g-{unique}", f"n-{unique}"
    await sim_nodes.start(node)
    a = await api.join(group, "a", nodes=[node], policy=GroupPolicy(max_turn_seconds=30))
    bare = f"bare-{unique}"
    started = await client.start_workflow(
        GroupWorkflow.run, GroupInput(group=bare), id=group_workflow_id(bare),
        task_queue=SCHEDULER_TASK_QUEUE,
    )  # fmt: skip
    older = f"older-{unique}"
    legacy = await client.start_workflow(
        "NoWorkerRunsThis", id=group_workflow_id(older), task_queue=f"nobody-{unique}",
        memo={WATCH_POLL_MEMO: 42.0},
    )  # fmt: skip

    async def record_published() -> bool:
        description = await started.describe()
        return await description.memo_value(MEMO_KEY, None) is not None

    await wait_until_async(record_published, "the bare group's run to publish its record")
    queried: list[str] = []
    real_query = WorkflowHandle.query

    async def counted(handle: WorkflowHandle[Any, Any], *args: Any, **kwargs: Any) -> Any:
        queried.append(handle.id)
        return await real_query(handle, *args, **kwargs)

    monkeypatch.setattr(WorkflowHandle, "query", counted)
    watches = TurnWatches(client)
    assert await watches.interval(group) == watch.POLL_SECONDS  # it may ask to yield
    assert await watches.interval(bare) == watch.poll_seconds(GroupPolicy())
    assert await watches.interval(older) == 42.0
    assert queried == []
    for handle in (started, legacy):
        await handle.terminate("test over")
    await a.leave()


@pytest.mark.parametrize("carried", ["legacy keys", "record"])
async def test_a_run_continued_as_new_clears_a_yield_request_its_memo_carried_over(
    client: Client, scheduler: Worker, unique: str, carried: str
) -> None:
    """A run that continued as new starts with the last run's memo. Where
    the last run's holder was asked to yield and the new run asks nobody,
    the memo must say so: the holder's watch reads it. The keys of a run
    of an older scheduler go with the first record."""
    group = f"carried-{unique}"
    state = GroupState(group=group, policy=StoredPolicy.stored(GroupPolicy()), rules=RULES_POLICIES)
    memo: dict[str, Any] = (
        {YIELD_EPOCH_MEMO: 7}
        if carried == "legacy keys"
        else {MEMO_KEY: WatchRecord(yield_asked=(7, 0.0))}
    )
    handle = await client.start_workflow(
        GroupWorkflow.run, GroupInput(group=group, state=state), id=group_workflow_id(group),
        task_queue=SCHEDULER_TASK_QUEUE, memo=memo,
    )  # fmt: skip

    async def published() -> bool:
        description = await handle.describe()
        record = await description.memo_value(MEMO_KEY, None, type_hint=WatchRecord)
        gone = await description.memo_value(YIELD_EPOCH_MEMO, None) is None
        return record is not None and record.yield_asked == watch.NOT_ASKED and gone

    try:
        await wait_until_async(published, what="the carried yield request cleared")
    finally:
        await handle.terminate("test over")


@pytest.mark.parametrize("published", ["record", "legacy keys"])
async def test_a_backfill_holders_watch_asks_it_to_yield_at_the_moment_its_group_published(
    client: Client, unique: str, monkeypatch: pytest.MonkeyPatch, published: str
) -> None:
    """The watch asks at the published moment by its own clock: the group
    here (a workflow no worker runs) never asks by itself, and the watch's
    polls and keepalives are a minute apart, so only that moment wakes it."""
    monkeypatch.setattr(turn_watch, "KEEPALIVE_SECONDS", 60.0)
    group = f"ahead-{unique}"
    due = time.time() + 3.0
    memo: dict[str, Any] = (
        {MEMO_KEY: WatchRecord(yield_asked=(3, due), poll_seconds=60.0, backfill_poll_seconds=60.0)}
        if published == "record"
        else {WATCH_POLL_MEMO: 60.0, BACKFILL_YIELD_AT_MEMO: [3, due]}
    )
    handle = await client.start_workflow(
        "NoWorkerRunsThis", id=group_workflow_id(group), task_queue=f"nobody-{unique}",
        memo=memo,
        search_attributes=TypedSearchAttributes([SearchAttributePair(HOLDER, "bf")]),
    )  # fmt: skip
    notices = TurnWatches(client).notices(group, "bf", 3, backfill=True)
    try:
        first = await asyncio.wait_for(anext(notices), timeout=30)
        assert first.holding and not first.should_yield
        asked = await asyncio.wait_for(anext(notices), timeout=30)
        assert asked.should_yield and time.time() >= due
    finally:
        await notices.aclose()
        await handle.terminate("test over")
