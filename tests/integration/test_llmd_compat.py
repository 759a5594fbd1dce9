"""The llm-d orchestrator API served by the gateway (--llmd-compat): its
clients take turns unchanged.

The mapping of states: tests/unit/test_llmd_compat.py."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.conftest import SimNodes
from tests.gateways import start_gateway
from tests.groups import acquire, join
from tests.processes import detached, kill
from timeshare.activities.backends.processes import ProcessTable
from timeshare.credentials import llmd_job_token
from timeshare.errors import PermissionDenied
from timeshare.models import GroupPolicy
from timeshare.registration import register_process
from timeshare.v1 import llmd_compat_pb2 as llmd
from timeshare.v1 import llmd_compat_pb2_grpc as llmd_grpc
from timeshare.workers.agent.credentials import JobCredentials, group_lookup
from timeshare.workers.agent.registration_socket import serve_agent_socket
from timeshare.workers.gateway.llmd_compat import CompatSettings, peer_address
from timeshare.workers.gateway.llmd_status import GroupState, JobState

METHOD = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService/"


# The gateway replicas' shared secret (TIMESHARE_LLMD_SECRET), from which each
# llm-d job's token is derived.
LLMD_SECRET = b"shared by the gateway replicas"


# The generated stub types its methods for the blocking channel; on an
# asyncio channel they return awaitables.
Stub = Any


@pytest.fixture(scope="session")
async def compat_gateway(temporal_address: str, scheduler: Worker) -> AsyncIterator[str]:
    running = await start_gateway(temporal_address, CompatSettings(secret=LLMD_SECRET))
    address = running.address
    yield address
    await running.close()


@pytest.fixture
async def llmd_stub(compat_gateway: str) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(compat_gateway) as channel:
        yield llmd_grpc.TimeSliceOrchestratorServiceStub(channel)


async def status_when(
    stub: Stub, group: str, check: Callable[[llmd.GroupStatus], bool]
) -> llmd.GetGroupStatusResponse:
    """Poll GetGroupStatus until ``check`` holds (bounded)."""
    for _ in range(200):
        status: llmd.GetGroupStatusResponse = await stub.GetGroupStatus(
            llmd.GetGroupStatusRequest(group_id=group)
        )
        if check(status.group):
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"never held; last status {status}")


async def compat_group(client: Client, sim_nodes: SimNodes, unique: str) -> str:
    """A group whose nodes are set by one job joined through the timeshare API."""
    node = f"n-{unique}"
    await sim_nodes.start(node)
    await join(client, f"g-{unique}", "native", [node], GroupPolicy(lease_seconds=600))
    return f"g-{unique}"


async def test_llmd_client_jobs_take_turns_in_order(
    client: Client,
    sim_nodes: SimNodes,
    unique: str,
    llmd_stub: Stub,
) -> None:
    group = await compat_group(client, sim_nodes, unique)
    stub = llmd_stub
    first = await stub.Acquire(llmd.AcquireRequest(job_id="a", group_id=group))
    assert first.success and not first.context_restored  # a's first time on the GPU
    waiting = []
    for job in ("b", "c"):  # one at a time, so their order in the queue is known
        request = llmd.AcquireRequest(job_id=job, group_id=group)
        waiting.append(asyncio.ensure_future(stub.Acquire(request)))
        status = await status_when(stub, group, lambda s: s.waiter_queue_depth == len(waiting))
    assert status.group.group_state == GroupState.STATE_LOCKED
    assert status.group.locking_job == "a"
    released = await stub.Yield(llmd.YieldRequest(job_id="a", group_id=group))
    assert released.pending_waiters == 2 and not released.snapshot_deferred
    granted_b = await waiting[0]
    assert granted_b.success and granted_b.waited_ms > 0 and not waiting[1].done()
    await stub.Yield(llmd.YieldRequest(job_id="b", group_id=group))
    await waiting[1]
    alone = await stub.Yield(llmd.YieldRequest(job_id="c", group_id=group))
    assert alone.pending_waiters == 0 and alone.snapshot_deferred
    # Idle, with a brought back ahead of its request: of the jobs that have
    # had a turn, it has been away the longest (prefetch).
    await status_when(
        stub,
        group,
        lambda s: s.group_state == GroupState.STATE_IDLE_YIELDED and s.loaded_job == "a",
    )
    back = await stub.Acquire(llmd.AcquireRequest(job_id="a", group_id=group))
    assert back.context_restored  # a's state came back from host memory
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Yield(llmd.YieldRequest(job_id="b", group_id=group))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    for _ in range(50):  # Temporal's visibility store lags a moment
        listed = await stub.ListGroups(llmd.ListGroupsRequest())
        if group in listed.group_ids:
            break
        await asyncio.sleep(0.2)
    assert group in listed.group_ids


async def test_a_raw_call_by_full_method_name(
    client: Client, sim_nodes: SimNodes, unique: str, compat_gateway: str
) -> None:
    group = await compat_group(client, sim_nodes, unique)
    async with grpc.aio.insecure_channel(compat_gateway) as channel:
        acquire_rpc = channel.unary_unary(
            METHOD + "Acquire",
            request_serializer=llmd.AcquireRequest.SerializeToString,
            response_deserializer=llmd.AcquireResponse.FromString,
        )
        yield_rpc = channel.unary_unary(
            METHOD + "Yield",
            request_serializer=llmd.YieldRequest.SerializeToString,
            response_deserializer=llmd.YieldResponse.FromString,
        )
        for job in ("x", "y", "x"):
            granted = await acquire_rpc(llmd.AcquireRequest(job_id=job, group_id=group))
            assert granted.success
            released = await yield_rpc(llmd.YieldRequest(job_id=job, group_id=group))
            assert released.success and released.snapshot_deferred


async def test_a_degraded_group_reads_unknown_and_faulted(
    client: Client, unique: str, llmd_stub: Stub
) -> None:
    group, node = f"g-{unique}", f"silent-{unique}"
    handle = await join(client, group, "a", [node], GroupPolicy(agent_timeout_seconds=1))
    waiting = asyncio.ensure_future(acquire(handle, "a"))
    unknown = GroupState.STATE_UNKNOWN
    status = await status_when(llmd_stub, group, lambda s: s.group_state == unknown)
    assert [s.job_state for s in status.agent_job_states] == [JobState.STATE_FAULTED]
    waiting.cancel()
    await handle.terminate()


async def test_only_allowed_networks_and_groups_are_served(
    temporal_address: str, scheduler: Worker
) -> None:
    settings = CompatSettings(
        groups=frozenset({"only-this"}), allow=[ipaddress.ip_network("10.0.0.0/8")]
    )
    running = await start_gateway(temporal_address, settings)
    address = running.address
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = llmd_grpc.TimeSliceOrchestratorServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Acquire(llmd.AcquireRequest(job_id="a", group_id="only-this"))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await running.close()
    assert peer_address("ipv4:127.0.0.1:5000") == ipaddress.ip_address("127.0.0.1")
    assert peer_address("ipv6:[::1]:5000") == ipaddress.ip_address("::1")
    assert peer_address("ipv6:%5B::1%5D:5000") == ipaddress.ip_address("::1")
    assert peer_address("ipv6:[::ffff:10.0.0.5]:1") == ipaddress.ip_address("10.0.0.5")
    assert peer_address("unix:/run/x.sock") is None


async def test_llmd_jobs_register_with_the_token_the_gateway_derives(
    client: Client, sim_nodes: SimNodes, unique: str, llmd_stub: Stub, tmp_path: Path
) -> None:
    """llm-d clients carry no token, but their jobs' processes must prove
    their job to a node agent like any other: with the token the gateway
    derived for the job (`timeshare llmd-token`), never with the secret."""
    group = await compat_group(client, sim_nodes, unique)
    granted = await llmd_stub.Acquire(llmd.AcquireRequest(job_id="a", group_id=group))
    assert granted.success  # job a joined by the gateway, with a derived token
    processes, path = ProcessTable(), str(tmp_path / "agent.sock")
    credentials = JobCredentials(group_lookup(client))
    worker = detached(sys.executable, "-c", "import time; time.sleep(60)")
    try:
        async with await serve_agent_socket(path, processes, credentials=credentials):
            register = functools.partial(register_process, group, "a", path, worker)
            for token in (LLMD_SECRET.decode(), llmd_job_token(b"another secret", group, "a")):
                with pytest.raises(PermissionDenied, match="wrong or missing job token"):
                    await asyncio.to_thread(register, token=token)
            assert processes.jobs(group) == []
            derived = llmd_job_token(LLMD_SECRET, group, "a")
            assert await asyncio.to_thread(register, token=derived) == worker
            assert processes.processes(group, "a") == [worker]
    finally:
        kill(worker)
    await llmd_stub.Yield(llmd.YieldRequest(job_id="a", group_id=group))
