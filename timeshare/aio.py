"""The asyncio twin of timeshare.client: the same calls, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TypeVar

import grpc
import grpc.aio

from timeshare import _protocol as protocol
from timeshare.errors import Unavailable, from_rpc_error
from timeshare.models import GroupStatus, NodeRecord
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc

Response = TypeVar("Response")


class Client:
    def __init__(self, address: str | None = None) -> None:
        self.address = protocol.resolve_address(address)
        self._channel = grpc.aio.insecure_channel(self.address)
        self._stub = pb_grpc.TimeSlicerStub(self._channel)

    async def _call(
        self, method: Callable[..., Awaitable[Response]], request: object, **kwargs: object
    ) -> Response:
        try:
            return await method(request, **kwargs)
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.address) from None

    async def join(self, group: str, job: str, nodes: list[str] | None = None) -> Job:
        request = protocol.join_request(group, job, nodes)
        return Job(self, protocol.job_ref(request, await self._call(self._stub.Join, request)))

    async def get_group(self, group: str) -> GroupStatus:
        request = pb.GetGroupRequest(group=protocol.valid("group", group))
        return protocol.group_status(await self._call(self._stub.GetGroup, request))

    async def list_groups(self) -> list[GroupStatus]:
        response = await self._call(self._stub.ListGroups, pb.ListGroupsRequest())
        return [protocol.group_status(g) for g in response.groups]

    async def list_nodes(self) -> list[NodeRecord]:
        response = await self._call(self._stub.ListNodes, pb.ListNodesRequest())
        return [protocol.node_record(n) for n in response.nodes]

    async def close(self) -> None:
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
        response = await self._client._call(self._stub.Yield, self.ref.yield_request())
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
        await self._client._call(self._stub.Leave, self.ref.leave_request())
        self.ref.yielded()


def connect(address: str | None = None) -> Client:
    return Client(address)
