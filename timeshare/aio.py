"""The asyncio twin of timeshare.client: the same calls, awaited."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import grpc
import grpc.aio

from timeshare import _protocol as protocol
from timeshare.errors import Aborted, NotFound, TimeshareError, Unavailable, from_rpc_error
from timeshare.history import GroupHistory
from timeshare.models import GroupPolicy, GroupStatus, NodeRecord
from timeshare.registration import register_process
from timeshare.tracing import client_span
from timeshare.transport import Transport
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc

Response = TypeVar("Response")


class Client:
    def __init__(self, address: str | None = None, transport: Transport | None = None) -> None:
        self.address = protocol.resolve_address(address)
        self._transport = transport or Transport.resolve()
        self._channel = self._transport.aio_channel(self.address)
        self._stub = pb_grpc.TimeSlicerStub(self._channel)
        self._jobs: list[Job] = []

    async def _call(
        self, method: Callable[..., Awaitable[Response]], request: object, **kwargs: object
    ) -> Response:
        try:
            with client_span(method, self._transport.metadata) as metadata:
                return await method(request, metadata=metadata, **kwargs)
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.address) from None

    async def _call_idempotent(
        self, method: Callable[..., Awaitable[Response]], request: object
    ) -> Response:
        for _ in range(protocol.IDEMPOTENT_ATTEMPTS - 1):
            try:
                return await self._call(method, request)
            except Unavailable:
                await asyncio.sleep(protocol.RETRY_PAUSE_SECONDS)
        return await self._call(method, request)

    async def join(
        self,
        group: str | None = None,
        job: str | None = None,
        nodes: list[str] | None = None,
        policy: GroupPolicy | None = None,
        register: bool = False,
    ) -> Job:
        request = protocol.join_request(group, job, nodes, policy)
        if register:
            await asyncio.to_thread(register_process, request.group, request.job)
        response = await self._call(self._stub.Join, request)
        handle = Job(self, protocol.job_ref(request, response))
        self._jobs.append(handle)
        return handle

    async def group_history(self, group: str) -> GroupHistory:
        request = pb.GetGroupHistoryRequest(group=protocol.valid("group", group))
        return protocol.group_history(await self._call(self._stub.GetGroupHistory, request))

    async def get_group(self, group: str) -> GroupStatus:
        request = pb.GetGroupRequest(group=protocol.valid("group", group))
        return protocol.group_status(await self._call(self._stub.GetGroup, request))

    async def list_groups(self) -> list[GroupStatus]:
        response = await self._call(self._stub.ListGroups, pb.ListGroupsRequest())
        return [protocol.group_status(g) for g in response.groups]

    async def list_nodes(self) -> list[NodeRecord]:
        response = await self._call(self._stub.ListNodes, pb.ListNodesRequest())
        return [protocol.node_record(n) for n in response.nodes]

    async def evict(self, group: str, job: str, reason: str = "") -> GroupStatus:
        request = protocol.evict_request(group, job, reason)
        return protocol.group_status(await self._call(self._stub.Evict, request))

    async def pause(self, group: str, paused: bool = True) -> GroupStatus:
        request = protocol.pause_request(group, paused)
        return protocol.group_status(await self._call(self._stub.Pause, request))

    async def drain(self, node: str, drained: bool = True) -> list[str]:
        response = await self._call(self._stub.Drain, protocol.drain_request(node, drained))
        return list(response.groups)

    def _forget(self, job: Job) -> None:
        if job in self._jobs:
            self._jobs.remove(job)

    async def close(self) -> None:
        for job in list(self._jobs):
            await job.stop_heartbeats()
        await self._channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Job(protocol.JobIdentity):
    """One job's place in its group: acquire, yield, leave (awaited)."""

    def __init__(self, client: Client, ref: protocol.JobRef) -> None:
        self._client = client
        self._stub = client._stub
        self.ref = ref
        self._heartbeats = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.ref.heartbeat_seconds)
            try:
                await self._client._call(
                    self._stub.Heartbeat,
                    self.ref.heartbeat_request(),
                    timeout=self.ref.heartbeat_seconds,
                )
            except (Aborted, NotFound):
                return
            except TimeshareError:
                continue

    async def stop_heartbeats(self) -> None:
        self._heartbeats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._heartbeats

    async def acquire(self, timeout: float | None = None) -> protocol.Turn:
        request = self.ref.acquire_request(timeout)
        clock = asyncio.get_running_loop().time
        deadline = protocol.AcquireDeadline(timeout, clock())
        while True:
            rpc_timeout = deadline.rpc_timeout(clock())
            try:
                return self.ref.granted(
                    await self._client._call(self._stub.Acquire, request, timeout=rpc_timeout)
                )
            except Unavailable:
                deadline.check_retry(self.name, clock())
                await asyncio.sleep(protocol.RETRY_PAUSE_SECONDS)

    async def yield_(self) -> float:
        try:
            response = await self._client._call_idempotent(
                self._stub.Yield, self.ref.yield_request()
            )
        except Aborted:
            self.ref.yielded()
            raise
        self.ref.yielded()
        return response.held_seconds

    release = yield_

    @asynccontextmanager
    async def turn(self, timeout: float | None = None) -> AsyncIterator[protocol.Turn]:
        granted = await self.acquire(timeout)
        try:
            yield granted
        finally:
            await self.yield_()

    async def heartbeat(self) -> pb.HeartbeatResponse:
        return await self._client._call(self._stub.Heartbeat, self.ref.heartbeat_request())

    async def leave(self) -> None:
        await self.stop_heartbeats()
        await self._client._call_idempotent(self._stub.Leave, self.ref.leave_request())
        self.ref.yielded()
        self._client._forget(self)


def connect(
    address: str | None = None,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
) -> Client:
    """The asyncio twin of ``timeshare.connect``."""
    return Client(address, Transport.resolve(token, tls_ca, tls_cert, tls_key))
