"""The gRPC gateway over loopback, driven through the asyncio client library:
status codes, messages, health and reflection."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from temporalio.client import Client

import timeshare.aio
from tests.conftest import SimNodes
from tests.polling import wait_until_async
from timeshare import errors
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc


async def queued(api: timeshare.aio.Client, group: str, queue: list[str]) -> None:
    """Until the group's queue is ``queue``: a waiter has reached the scheduler."""

    async def seen() -> bool:
        return (await api.get_group(group)).queue == queue

    await wait_until_async(seen, f"{group}'s queue to be {queue}", every=0.05)


async def eventually_listed(api: timeshare.aio.Client, group: str) -> bool:
    # Temporal's visibility store lags the workflow by a moment.
    async def listed() -> bool:
        return group in [g.group for g in await api.list_groups()]

    return await wait_until_async(listed, f"{group} to be listed", every=0.2)


async def two_jobs(
    api: timeshare.aio.Client, sim_nodes: SimNodes, group: str, node: str
) -> tuple[timeshare.aio.Job, timeshare.aio.Job]:
    await sim_nodes.start(node)
    return await api.join(group, "a", nodes=[node]), await api.join(group, "b", nodes=[node])


async def test_turns_through_the_gateway(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    node = f"n-{unique}"
    a, b = await two_jobs(api, sim_nodes, f"g-{unique}", node)
    async with a.turn() as first:
        waiting = asyncio.create_task(b.acquire())
        await queued(api, f"g-{unique}", ["b"])
        assert not waiting.done()
    second = await waiting
    assert second.epoch == first.epoch + 1 and second.ticket == first.ticket + 1
    beat = await b.heartbeat()
    assert beat.holding and beat.epoch == second.epoch
    await b.yield_()
    status = await api.get_group(f"g-{unique}")
    # Nobody holds or waits; a, away the longest, may be coming back already.
    assert (status.holder, status.epoch, status.queue) == ("", 2, [])
    assert await eventually_listed(api, f"g-{unique}")
    await a.leave()
    await b.leave()
    assert (await api.get_group(f"g-{unique}")).jobs == []


INVALID = "INVALID_ARGUMENT"


async def test_bad_requests_get_clear_status_codes(
    api: timeshare.aio.Client, gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    node = f"n-{unique}"
    await sim_nodes.start(node)
    group = f"g-{unique}"
    a = await api.join(group, "a", nodes=[node])
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = pb_grpc.TimeSlicerStub(channel)
        token = a.ref.token
        cases: list[tuple[Any, Any, str]] = [
            (stub.Join, pb.JoinRequest(group="Bad Name", job="a", nodes=[node]), INVALID),
            (stub.Join, pb.JoinRequest(group=group, job="a" * 64, nodes=[node]), INVALID),
            (stub.Join, pb.JoinRequest(group=group, job="c", nodes=["x", "x"]), "INVALID_ARGUMENT"),
            (stub.GetGroup, pb.GetGroupRequest(group=f"missing-{unique}"), "NOT_FOUND"),
            (stub.Acquire, pb.AcquireRequest(group=f"missing-{unique}", job="a", request_id="r"),
             "NOT_FOUND"),
            (stub.Acquire, pb.AcquireRequest(group=group, job="a", job_token="no", request_id="r"),
             "UNAUTHENTICATED"),
            (stub.Acquire, pb.AcquireRequest(group=group, job="ghost", job_token="t"), "NOT_FOUND"),
            (stub.Acquire, pb.AcquireRequest(group=group, job="a", job_token=token, request_id="r",
                                             timeout_seconds=-1), "INVALID_ARGUMENT"),
            (stub.Yield, pb.YieldRequest(group=group, job="a", job_token=token, epoch=5),
             "FAILED_PRECONDITION"),
            (stub.RegisterProcess, pb.RegisterProcessRequest(group=group, job="a"),
             "FAILED_PRECONDITION"),
        ]  # fmt: skip
        before = await api.get_group(group)
        for method, request, expected in cases:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await method(request)
            assert refused.value.code().name == expected, refused.value.details()
            assert refused.value.details()
        assert await api.get_group(group) == before


async def test_acquire_timeout_is_deadline_exceeded(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    a, b = await two_jobs(api, sim_nodes, f"g-{unique}", f"n-{unique}")
    await a.acquire()
    with pytest.raises(errors.DeadlineExceeded):
        await b.acquire(timeout=0.5)
    assert (await api.get_group(f"g-{unique}")).queue == []


async def test_client_side_checks_need_no_server(api: timeshare.aio.Client, unique: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        await api.join("UPPER", "a", nodes=["n"])


async def test_health_and_reflection(gateway: str) -> None:
    async with grpc.aio.insecure_channel(gateway) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service="timeshare.v1.TimeSlicer"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = [r async for r in reflect.ServerReflectionInfo(iter([request]))]
        names = [s.name for s in responses[0].list_services_response.service]
        assert "timeshare.v1.TimeSlicer" in names


async def test_join_without_nodes_needs_exactly_one_live_node(
    api: timeshare.aio.Client, client: Client, unique: str
) -> None:
    # Other tests' agents never announce themselves, so the registry is empty
    # or holds nodes from this suite: either way not exactly one is assumed.
    nodes = await api.list_nodes()
    live = [n for n in nodes if n.alive]
    if len(live) == 1:
        job = await api.join(f"g-{unique}", "a", nodes=[])
        assert job.ref.nodes == [live[0].node]
    else:
        with pytest.raises(errors.InvalidArgument) as refused:
            await api.join(f"g-{unique}", "a", nodes=[])
        assert "TIMESHARE_NODES" in refused.value.message


async def test_operator_controls_through_the_gateway(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group, node = f"g-{unique}", f"n-{unique}"
    a, b = await two_jobs(api, sim_nodes, group, node)
    assert (await api.pause(group)).state == "paused"
    waiting = asyncio.create_task(a.acquire())
    await queued(api, group, ["a"])
    assert not waiting.done()
    assert (await api.pause(group, paused=False)).state in ("held", "switching")
    await waiting
    assert group in await api.drain(node)
    assert (await api.get_group(group)).drained == [node]
    await api.drain(node, drained=False)
    status = await api.evict(group, "b", reason="maintenance")
    assert [j.job for j in status.jobs] == ["a"]
    with pytest.raises(errors.Aborted) as evicted:
        await b.acquire()
    assert "maintenance" in evicted.value.message
    with pytest.raises(errors.InvalidArgument):
        await api.evict(group, "b", reason="x" * 2000)


async def test_a_caller_that_goes_away_gives_its_place_back(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str
) -> None:
    group = f"g-{unique}"
    a, b = await two_jobs(api, sim_nodes, group, f"n-{unique}")
    await a.acquire()
    waiting = asyncio.create_task(b.acquire())
    queues = []
    for _ in range(100):
        queues.append((await api.get_group(group)).queue)
        if queues[-1] == ["b"] and not waiting.done():
            waiting.cancel()  # the RPC is cancelled, as when a client dies
        if queues[-1] == [] and waiting.cancelled():
            break
        await asyncio.sleep(0.1)
    assert ["b"] in queues and queues[-1] == []


async def test_group_and_job_may_come_from_the_environment(
    api: timeshare.aio.Client, sim_nodes: SimNodes, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = f"n-{unique}"
    await sim_nodes.start(node)
    with pytest.raises(errors.InvalidArgument, match="TIMESHARE_GROUP"):
        await api.join(job="a", nodes=[node])
    monkeypatch.setenv("TIMESHARE_GROUP", f"env-{unique}")
    monkeypatch.setenv("TIMESHARE_JOB", "from-env")
    job = await api.join(nodes=[node])
    assert (job.group, job.name) == (f"env-{unique}", "from-env")
    await job.leave()
