"""The blocking client. Use ``timeshare.connect()``; ``timeshare.aio`` is its asyncio twin."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TypeVar

import grpc

from timeshare import _protocol as protocol
from timeshare.errors import Unavailable, from_rpc_error
from timeshare.models import GroupStatus, NodeRecord
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc

Response = TypeVar("Response")


class Client:
    """A connection to a timeshare gateway (or a node agent's socket)."""

    def __init__(self, address: str | None = None) -> None:
        self.address = protocol.resolve_address(address)
        self._channel = grpc.insecure_channel(self.address)
        self._stub = pb_grpc.TimeSlicerStub(self._channel)

    def _call(self, method: Callable[..., Response], request: object, **kwargs: object) -> Response:
        try:
            return method(request, **kwargs)
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.address) from None

    def join(self, group: str, job: str, nodes: list[str] | None = None) -> Job:
        """Join ``group`` as ``job``; ``nodes`` defaults to TIMESHARE_NODES, else the only node."""
        request = protocol.join_request(group, job, nodes)
        return Job(self, protocol.job_ref(request, self._call(self._stub.Join, request)))

    def get_group(self, group: str) -> GroupStatus:
        request = pb.GetGroupRequest(group=protocol.valid("group", group))
        return protocol.group_status(self._call(self._stub.GetGroup, request))

    def list_groups(self) -> list[GroupStatus]:
        response = self._call(self._stub.ListGroups, pb.ListGroupsRequest())
        return [protocol.group_status(g) for g in response.groups]

    def list_nodes(self) -> list[NodeRecord]:
        response = self._call(self._stub.ListNodes, pb.ListNodesRequest())
        return [protocol.node_record(n) for n in response.nodes]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Job(protocol.JobIdentity):
    """One job's place in its group: acquire, yield, leave."""

    def __init__(self, client: Client, ref: protocol.JobRef) -> None:
        self._client = client
        self._stub = client._stub
        self.ref = ref

    def acquire(self, timeout: float | None = None) -> protocol.Turn:
        """Block until this job holds the group's GPUs; its state is back on its nodes."""
        request = self.ref.acquire_request(timeout)
        deadline = protocol.AcquireDeadline(timeout, time.monotonic())
        while True:
            rpc_timeout = deadline.rpc_timeout(time.monotonic())
            try:
                return self.ref.granted(
                    self._client._call(self._stub.Acquire, request, timeout=rpc_timeout)
                )
            except Unavailable:
                deadline.check_retry(self.name, time.monotonic())
                time.sleep(protocol.RETRY_PAUSE_SECONDS)

    def yield_(self) -> float:
        """Give the GPUs back; returns the seconds this turn was held."""
        response = self._client._call(self._stub.Yield, self.ref.yield_request())
        self.ref.yielded()
        return response.held_seconds

    release = yield_

    @contextmanager
    def turn(self, timeout: float | None = None) -> Iterator[protocol.Turn]:
        """``with job.turn(): trainer.step()`` — acquire, then always yield."""
        granted = self.acquire(timeout)
        try:
            yield granted
        finally:
            self.yield_()

    def heartbeat(self) -> pb.HeartbeatResponse:
        return self._client._call(self._stub.Heartbeat, self.ref.heartbeat_request())

    def leave(self) -> None:
        self._client._call(self._stub.Leave, self.ref.leave_request())
        self.ref.yielded()


def connect(address: str | None = None) -> Client:
    """Connect to ``address``, else TIMESHARE_ADDRESS, else localhost:50051."""
    return Client(address)
