"""The gateway: the timeshare.v1.TimeSlicer gRPC service, translating each
call into a message to the group's workflow. Stateless; run any number."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import uuid
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from temporalio.client import Client, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from timeshare.models import (
    AcquireInput,
    DrainInput,
    EvictInput,
    JobInput,
    JoinInput,
    NodeRecord,
    PauseInput,
    YieldInput,
)
from timeshare.names import NODE_REGISTRY_WORKFLOW_ID
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc
from workers import gateway_convert as convert
from workers.gateway_errors import InvalidRequest, rpc, within
from workers.group_client import GroupHandle, acquire_turn, group_handle, join_group
from workers.service import StartupError, connect_temporal, ready
from workflows.group import CancelAcquireInput, GroupWorkflow
from workflows.registry import NodeRegistryWorkflow

Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["TimeSlicer"].full_name
# Short messages (join, yield, status) must be answered by then, or the
# scheduler worker is presumed down and the caller is told so.
MESSAGE_SECONDS = 30.0
MAX_MESSAGE_BYTES = 4 * 2**20
RUNNING_GROUPS = "WorkflowType = 'GroupWorkflow' AND ExecutionStatus = 'Running'"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TimeSlicerService(pb_grpc.TimeSlicerServicer):
    def __init__(self, client: Client) -> None:
        self._client = client
        self._background: set[asyncio.Task[None]] = set()

    def _group(self, group: str) -> GroupHandle:
        return group_handle(self._client, convert.name("group", group))

    # -- jobs -------------------------------------------------------------------

    @rpc
    async def Join(self, request: pb.JoinRequest, context: Context) -> pb.JoinResponse:
        group = convert.name("group", request.group)
        job = convert.name("job", request.job)
        nodes = convert.nodes(request.nodes) or await self._only_live_node()
        policy = convert.policy(request.policy) if request.HasField("policy") else None
        token = secrets.token_urlsafe(32)
        message = JoinInput(job=job, nodes=nodes, token_hash=token_hash(token))
        joined = await within(MESSAGE_SECONDS, join_group(self._client, group, message, policy))
        return pb.JoinResponse(
            job_token=token,
            nodes=joined.nodes,
            created=joined.created,
            lease_seconds=joined.lease_seconds,
        )

    async def _only_live_node(self) -> list[str]:
        live = [node.node for node in await self._nodes() if node.alive]
        if len(live) != 1:
            raise InvalidRequest(
                f"nodes: none given and {len(live)} live nodes are registered "
                f"({', '.join(live) or 'none'}); name the job's nodes "
                "(nodes=[...] or TIMESHARE_NODES)"
            )
        return live

    @rpc
    async def Acquire(self, request: pb.AcquireRequest, context: Context) -> pb.AcquireResponse:
        handle = self._group(request.group)
        message = AcquireInput(
            job=convert.name("job", request.job),
            token_hash=token_hash(request.job_token),
            request_id=convert.request_id(request.request_id) or uuid.uuid4().hex,
            timeout_seconds=convert.acquire_timeout(
                request.timeout_seconds, context.time_remaining()
            ),
        )
        try:
            grant = await acquire_turn(handle, message)
        except (asyncio.CancelledError, WorkflowUpdateRPCTimeoutOrCancelledError):
            # The caller went away: give its place in the queue back.
            withdrawal = asyncio.get_running_loop().create_task(self._withdraw(handle, message))
            self._background.add(withdrawal)
            withdrawal.add_done_callback(self._background.discard)
            raise asyncio.CancelledError() from None
        return pb.AcquireResponse(
            epoch=grant.resumes_epoch or grant.epoch,
            ticket=grant.ticket,
            waited_seconds=grant.waited_seconds,
            switch_seconds=grant.switch_seconds,
            granted_at=grant.granted_at,
        )

    async def _withdraw(self, handle: GroupHandle, message: AcquireInput) -> None:
        withdrawal = CancelAcquireInput(
            job=message.job, token_hash=message.token_hash, request_id=message.request_id
        )
        # Best effort: the job's lease is the backstop.
        with contextlib.suppress(Exception):
            await within(
                MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.cancel_acquire, withdrawal)
            )

    @rpc
    async def Yield(self, request: pb.YieldRequest, context: Context) -> pb.YieldResponse:
        message = YieldInput(
            job=convert.name("job", request.job),
            token_hash=token_hash(request.job_token),
            epoch=request.epoch,
        )
        handle = self._group(request.group)
        result = await within(
            MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.yield_turn, message)
        )
        return pb.YieldResponse(held_seconds=result.held_seconds)

    @rpc
    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: Context
    ) -> pb.HeartbeatResponse:
        handle = self._group(request.group)
        beat = await within(
            MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.heartbeat, self._job(request))
        )
        return pb.HeartbeatResponse(
            holding=beat.holding,
            epoch=beat.epoch,
            waiting=beat.waiting,
            should_yield=beat.should_yield,
            preempted=beat.preempted,
            lease_seconds=beat.lease_seconds,
        )

    @rpc
    async def Leave(self, request: pb.LeaveRequest, context: Context) -> pb.LeaveResponse:
        handle = self._group(request.group)
        await within(
            MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.leave, self._job(request))
        )
        return pb.LeaveResponse()

    @staticmethod
    def _job(request: pb.HeartbeatRequest | pb.LeaveRequest) -> JobInput:
        return JobInput(
            job=convert.name("job", request.job), token_hash=token_hash(request.job_token)
        )

    # -- status -------------------------------------------------------------------

    @rpc
    async def GetGroup(self, request: pb.GetGroupRequest, context: Context) -> pb.GroupStatus:
        status = await within(
            MESSAGE_SECONDS, self._group(request.group).query(GroupWorkflow.status)
        )
        return convert.group_status(status)

    @rpc
    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: Context
    ) -> pb.ListGroupsResponse:
        groups = []
        async for execution in self._client.list_workflows(RUNNING_GROUPS):
            handle = self._client.get_workflow_handle_for(GroupWorkflow.run, execution.id)
            status = await within(MESSAGE_SECONDS, handle.query(GroupWorkflow.status))
            groups.append(convert.group_status(status))
        return pb.ListGroupsResponse(groups=sorted(groups, key=lambda g: g.group))

    @rpc
    async def ListNodes(
        self, request: pb.ListNodesRequest, context: Context
    ) -> pb.ListNodesResponse:
        return pb.ListNodesResponse(nodes=[convert.node_status(n) for n in await self._nodes()])

    def _registry(self) -> Any:
        return self._client.get_workflow_handle_for(
            NodeRegistryWorkflow.run, NODE_REGISTRY_WORKFLOW_ID
        )

    async def _nodes(self) -> list[NodeRecord]:
        try:
            nodes: list[NodeRecord] = await within(
                MESSAGE_SECONDS, self._registry().query(NodeRegistryWorkflow.nodes)
            )
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return []  # no agent has ever announced itself
            raise
        return nodes

    async def RegisterProcess(
        self, request: pb.RegisterProcessRequest, context: Context
    ) -> pb.RegisterProcessResponse:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            "RegisterProcess is served only on a node agent's Unix socket, "
            "where the kernel vouches for the caller's process id",
        )
        raise AssertionError("unreachable")

    # -- operator controls ----------------------------------------------------------

    @rpc
    async def Evict(self, request: pb.EvictRequest, context: Context) -> pb.GroupStatus:
        handle = self._group(request.group)
        reason = convert.reason(request.reason) or "evicted by an operator"
        message = EvictInput(job=convert.name("job", request.job), reason=reason)
        await within(MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.evict, message))
        return convert.group_status(
            await within(MESSAGE_SECONDS, handle.query(GroupWorkflow.status))
        )

    @rpc
    async def Pause(self, request: pb.PauseRequest, context: Context) -> pb.GroupStatus:
        handle = self._group(request.group)
        message = PauseInput(paused=request.paused)
        status = await within(MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.pause, message))
        return convert.group_status(status)

    @rpc
    async def Drain(self, request: pb.DrainRequest, context: Context) -> pb.DrainResponse:
        message = DrainInput(node=convert.name("node", request.node), drained=request.drained)
        told = []
        async for execution in self._client.list_workflows(RUNNING_GROUPS):
            handle = self._client.get_workflow_handle_for(GroupWorkflow.run, execution.id)
            status = await within(
                MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.drain, message)
            )
            told.append(status.group)
        with contextlib.suppress(RPCError):  # no registry yet: nothing to mark
            await within(
                MESSAGE_SECONDS, self._registry().signal(NodeRegistryWorkflow.set_drained, message)
            )
        return pb.DrainResponse(groups=sorted(told))


async def serve_gateway(stop: asyncio.Event, temporal: str, namespace: str, listen: str) -> None:
    client = await connect_temporal(temporal, namespace)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
    )
    pb_grpc.add_TimeSlicerServicer_to_server(TimeSlicerService(client), server)
    health_service = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    reflection.enable_server_reflection(
        [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME],
        server,
    )  # fmt: skip
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError:
        port = 0
    if port == 0:
        raise StartupError(
            f"cannot listen on {listen}: the address is in use or invalid; "
            "stop the other gateway or pass --listen HOST:PORT"
        )
    await server.start()
    await health_service.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_service.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    ready("gateway", f"{listen} (gRPC {SERVICE_NAME}), Temporal {temporal}/{namespace}")
    await stop.wait()
    await health_service.enter_graceful_shutdown()
    await server.stop(grace=5)
