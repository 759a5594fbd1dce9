"""The blocking client. Use ``timeshare.connect()``; ``timeshare.aio`` is its asyncio twin."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import grpc

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
    """A connection to a timeshare gateway (or a node agent's socket)."""

    def __init__(self, address: str | None = None, transport: Transport | None = None) -> None:
        self.address = protocol.resolve_address(address)
        self._transport = transport or Transport.resolve()
        self._channel = self._transport.channel(self.address)
        self._stub = pb_grpc.TimeSlicerStub(self._channel)
        self._jobs: list[Job] = []

    def _call(self, method: Callable[..., Response], request: object, **kwargs: object) -> Response:
        try:
            with client_span(method, self._transport.metadata) as metadata:
                return method(request, metadata=metadata, **kwargs)
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.address) from None

    def _call_idempotent(self, method: Callable[..., Response], request: object) -> Response:
        for _ in range(protocol.IDEMPOTENT_ATTEMPTS - 1):
            try:
                return self._call(method, request)
            except Unavailable:
                time.sleep(protocol.RETRY_PAUSE_SECONDS)
        return self._call(method, request)

    def join(
        self,
        group: str | None = None,
        job: str | None = None,
        nodes: list[str] | None = None,
        policy: GroupPolicy | None = None,
        register: bool = False,
    ) -> Job:
        """Join ``group`` as ``job`` (defaults: TIMESHARE_GROUP, TIMESHARE_JOB); ``nodes``
        defaults to TIMESHARE_NODES, else the only node. ``policy`` applies if this join
        creates the group. The handle keeps the job's lease alive from a background thread
        until ``leave()`` or ``close()``.
        ``register=True`` also registers this process with the local agent: only for a
        process that both uses the GPU and asks for turns (see register_process)."""
        request = protocol.join_request(group, job, nodes, policy)
        if register:
            register_process(request.group, request.job)
        handle = Job(self, protocol.job_ref(request, self._call(self._stub.Join, request)))
        self._jobs.append(handle)
        return handle

    def group_history(self, group: str) -> GroupHistory:
        """The group's recent turns and switches, as `timeshare report` draws them."""
        request = pb.GetGroupHistoryRequest(group=protocol.valid("group", group))
        return protocol.group_history(self._call(self._stub.GetGroupHistory, request))

    def get_group(self, group: str) -> GroupStatus:
        request = pb.GetGroupRequest(group=protocol.valid("group", group))
        return protocol.group_status(self._call(self._stub.GetGroup, request))

    def list_groups(self) -> list[GroupStatus]:
        response = self._call(self._stub.ListGroups, pb.ListGroupsRequest())
        return [protocol.group_status(g) for g in response.groups]

    def list_nodes(self) -> list[NodeRecord]:
        response = self._call(self._stub.ListNodes, pb.ListNodesRequest())
        return [protocol.node_record(n) for n in response.nodes]

    def evict(self, group: str, job: str, reason: str = "") -> GroupStatus:
        request = protocol.evict_request(group, job, reason)
        return protocol.group_status(self._call(self._stub.Evict, request))

    def pause(self, group: str, paused: bool = True) -> GroupStatus:
        request = protocol.pause_request(group, paused)
        return protocol.group_status(self._call(self._stub.Pause, request))

    def drain(self, node: str, drained: bool = True) -> list[str]:
        """Drain (or with ``drained=False`` restore) a node; returns the groups told."""
        response = self._call(self._stub.Drain, protocol.drain_request(node, drained))
        return list(response.groups)

    def _forget(self, job: Job) -> None:
        if job in self._jobs:
            self._jobs.remove(job)

    def close(self) -> None:
        for job in list(self._jobs):
            job.stop_heartbeats()
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
        self._stopped = threading.Event()
        self._heartbeats = threading.Thread(
            target=self._beat, name=f"timeshare-heartbeat-{ref.job}", daemon=True
        )
        self._heartbeats.start()

    def _beat(self) -> None:
        while not self._stopped.wait(self.ref.heartbeat_seconds):
            try:
                self._client._call(
                    self._stub.Heartbeat,
                    self.ref.heartbeat_request(),
                    timeout=self.ref.heartbeat_seconds,
                )
            except (Aborted, NotFound):
                return  # evicted or gone: the job's next call says why
            except (TimeshareError, ValueError):
                continue  # a missed beat (or a closing channel); the lease allows for some

    def stop_heartbeats(self) -> None:
        self._stopped.set()
        if self._heartbeats is not threading.current_thread():
            self._heartbeats.join(timeout=self.ref.heartbeat_seconds + 1)

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
        try:
            response = self._client._call_idempotent(self._stub.Yield, self.ref.yield_request())
        except Aborted:
            self.ref.yielded()  # evicted: there is no turn left to give back
            raise
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
        self.stop_heartbeats()
        self._client._call_idempotent(self._stub.Leave, self.ref.leave_request())
        self.ref.yielded()
        self._client._forget(self)


def connect(
    address: str | None = None,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
) -> Client:
    """Connect to ``address``, else TIMESHARE_ADDRESS, else localhost:50051.
    ``token`` (else TIMESHARE_TOKEN) is the gateway's bearer token, if it asks for
    one; ``tls_ca`` (else TIMESHARE_TLS_CA) turns on TLS, ``tls_cert`` and
    ``tls_key`` add a client certificate."""
    return Client(address, Transport.resolve(token, tls_ca, tls_cert, tls_key))
