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
from timeshare.errors import DeadlineExceeded, Unavailable, from_rpc_error
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


class Job:
    def __init__(self, client: Client, ref: protocol.JobRef) -> None:
        self._client = client
        self._stub = client._stub
        self.ref = ref

    @property
    def group(self) -> str:
        return self.ref.group

    @property
    def name(self) -> str:
        return self.ref.job

    async def acquire(self, timeout: float | None = None) -> protocol.Turn:
        request = self.ref.acquire_request(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                response = await self._client._call(
                    self._stub.Acquire,
                    request,
                    timeout=None if remaining is None else remaining + 5,
                )
                return self.ref.granted(response)
            except Unavailable:
                if remaining is not None and remaining <= 0:
                    raise DeadlineExceeded(f"job {self.name!r} was not granted in time") from None
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
