"""The gateway: the timeshare.v1.TimeSlicer gRPC service, translating each
call into a message to the group's workflow. Stateless; run any number."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import propagate
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from timeshare.credentials import token_hash
from timeshare.instruments import record_grant, record_turn
from timeshare.models import Grant, NodeRecord, PublishedTurn, YieldOutput
from timeshare.names import NODE_REGISTRY_WORKFLOW_ID
from timeshare.scheduling import events as ev
from timeshare.v1 import llmd_compat_pb2_grpc as llmd_grpc
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc
from timeshare.workers.common.service import StartupError, ready, wait_for_temporal
from timeshare.workers.common.telemetry import Telemetry
from timeshare.workers.common.temporal_settings import TemporalSettings
from timeshare.workers.gateway import convert, messages
from timeshare.workers.gateway.access import Access, GatewaySecurity
from timeshare.workers.gateway.claims import join_claiming_gpus, unclaim
from timeshare.workers.gateway.errors import (
    MESSAGE_SECONDS,
    AccessDenied,
    CallUnsupported,
    InvalidRequest,
    rpc,
    unknown_update,
    within,
)
from timeshare.workers.gateway.group_client import (
    GroupHandle,
    acquire_or_withdraw,
    count_running_groups,
    group_handle,
    group_running,
    registered_nodes,
    running_groups,
)
from timeshare.workers.gateway.group_list import listed_statuses
from timeshare.workers.gateway.llmd_compat import SERVICE_NAME as LLMD_SERVICE_NAME
from timeshare.workers.gateway.llmd_compat import (
    CompatSettings,
    TimeSliceOrchestratorCompat,
    log_llmd_compat,
)
from timeshare.workers.gateway.server_clock import ServerClock
from timeshare.workers.gateway.turn_watch import GroupNotFound, TurnWatches
from timeshare.workflows.group import GroupWorkflow
from timeshare.workflows.registry import NodeRegistryWorkflow, UnclaimInput

Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["TimeSlicer"].full_name
MAX_MESSAGE_BYTES = 4 * 2**20
DEFAULT_MAX_GROUPS = 1000


class TimeSlicerService(pb_grpc.TimeSlicerServicer):
    def __init__(
        self,
        client: Client,
        access: Access | None = None,
        max_groups: int = DEFAULT_MAX_GROUPS,
        clock: ServerClock | None = None,
    ) -> None:
        self._client = client
        self._access = access or Access(None)
        self._max_groups = max_groups
        self._background: set[asyncio.Task[None]] = set()
        # The history hosts' clock, learned from the grants relayed here.
        self._clock = clock or ServerClock()
        self._watches = TurnWatches(client, self._clock)

    def _group(self, group: str) -> GroupHandle:
        return group_handle(self._client, convert.name("group", group))

    # -- jobs -------------------------------------------------------------------

    @rpc
    async def Join(self, request: pb.JoinRequest, context: Context) -> pb.JoinResponse:
        self._access.require(context, request.group)
        group = convert.name("group", request.group)
        token = secrets.token_urlsafe(32)
        message = messages.event_of(ev.Join, request, token_hash=token_hash(token))
        if not message.nodes:
            message = dataclasses.replace(message, nodes=await self._only_live_node())
        policy = convert.policy(request.policy) if request.HasField("policy") else None
        await self._check_room_for(group)
        joined = await join_claiming_gpus(
            self._client, group, message, policy, clock=self._clock.now
        )
        return messages.reply(pb.JoinResponse, joined, job_token=token)

    async def _check_room_for(self, group: str) -> None:
        """Refuse a new group beyond the deployment's limit (visibility lags, so
        a burst of new groups can overshoot it by a few)."""
        if await within(MESSAGE_SECONDS, group_running(self._client, group)):
            return
        running = await within(MESSAGE_SECONDS, count_running_groups(self._client))
        if running >= self._max_groups:
            raise AccessDenied(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"group: {running} groups already run here (limit {self._max_groups}, "
                "gateway --max-groups); join an existing group or raise the limit",
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
        self._access.require(context, request.group)
        handle = self._group(request.group)
        trace_context: dict[str, str] = {}
        propagate.inject(trace_context)
        message = messages.event_of(
            ev.Acquire,
            request,
            trace_context=trace_context,
            request_id=convert.request_id(request.request_id) or uuid.uuid4().hex,
            timeout_seconds=convert.acquire_timeout(
                request.timeout_seconds, context.time_remaining()
            ),
        )

        def yielded(given_back: YieldOutput) -> None:
            record_turn(request.group, message.job, given_back.held_seconds, given_back.phase)

        def published(grant: Grant, facts: PublishedTurn) -> None:
            self._watches.granted(request.group, grant, facts)

        grant = await acquire_or_withdraw(handle, message, self._background, yielded, published)
        self._clock.note(grant.granted_at)
        record_grant(request.group, message.job, grant.waited_seconds, grant.phase)
        return messages.reply(pb.AcquireResponse, grant, {"epoch": "told_epoch"})

    async def WatchTurn(
        self, request: pb.WatchTurnRequest, context: Context
    ) -> AsyncIterator[pb.TurnNotice]:
        # A stream: the @rpc wrapper serves unary calls only, so the
        # refusals are reported here. The watch shows no more than GetGroup
        # does, so the gateway's own caller check is the check.
        try:
            self._access.require(context, request.group)
            group = convert.name("group", request.group)
            job = convert.name("job", request.job)
        except (InvalidRequest, AccessDenied) as error:
            code = (
                error.code if isinstance(error, AccessDenied) else grpc.StatusCode.INVALID_ARGUMENT
            )
            await context.abort(code, str(error))
        try:
            async for notice in self._watches.notices(group, job, request.epoch, request.backfill):
                yield notice
        except GroupNotFound:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"group {group!r} does not exist; Join creates it"
            )
        except RPCError as error:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"Temporal refused the watch ({error.status.name}: {error.message}); retry",
            )

    @rpc
    async def Yield(self, request: pb.YieldRequest, context: Context) -> pb.YieldResponse:
        self._access.require(context, request.group)
        message = messages.event_of(ev.Yield, request)
        handle = self._group(request.group)
        result = await within(
            MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.yield_turn, message)
        )
        record_turn(request.group, message.job, result.held_seconds, result.phase)
        return messages.reply(pb.YieldResponse, result)

    @rpc
    async def KeepTurn(self, request: pb.KeepTurnRequest, context: Context) -> pb.KeepTurnResponse:
        self._access.require(context, request.group)
        message = messages.event_of(ev.KeepTurn, request)
        handle = self._group(request.group)
        try:
            kept = await within(
                MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.keep_turn, message)
            )
        except WorkflowUpdateFailedError as error:
            if unknown_update(error):
                # Nothing changed: the job goes on holding its turn.
                raise CallUnsupported(
                    "the scheduler predates KeepTurn; the client goes on with next_turn "
                    "(Acquire with yield_epoch) until the scheduler is upgraded"
                ) from None
            raise
        record_turn(request.group, message.job, kept.ended.held_seconds, kept.ended.phase)
        grant = kept.grant
        self._clock.note(grant.granted_at)
        record_grant(request.group, message.job, 0.0, grant.phase)
        return messages.reply(
            pb.KeepTurnResponse, grant, {"epoch": "told_epoch"}, asked_to_yield=kept.asked_to_yield
        )

    @rpc
    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: Context
    ) -> pb.HeartbeatResponse:
        self._access.require(context, request.group)
        handle = self._group(request.group)
        message = messages.event_of(ev.Heartbeat, request)
        beat = handle.execute_update(GroupWorkflow.heartbeat, message)
        return messages.reply(pb.HeartbeatResponse, await within(MESSAGE_SECONDS, beat))

    @rpc
    async def Leave(self, request: pb.LeaveRequest, context: Context) -> pb.LeaveResponse:
        self._access.require(context, request.group)
        handle = self._group(request.group)
        job = messages.event_of(ev.Leave, request)
        await within(MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.leave, job))
        # Its GPUs are free for another group (its agents drop the claim too,
        # when they release its processes).
        with contextlib.suppress(Exception):
            group = convert.name("group", request.group)
            await unclaim(self._client, UnclaimInput(group=group, job=job.job))
        return pb.LeaveResponse()

    # -- status -------------------------------------------------------------------

    @rpc
    async def GetGroup(self, request: pb.GetGroupRequest, context: Context) -> pb.GroupStatus:
        self._access.require(context, request.group)
        status = await within(
            MESSAGE_SECONDS, self._group(request.group).query(GroupWorkflow.status)
        )
        return messages.group_status(status)

    @rpc
    async def GetGroupHistory(
        self, request: pb.GetGroupHistoryRequest, context: Context
    ) -> pb.GroupHistory:
        self._access.require(context, request.group)
        history = await within(
            MESSAGE_SECONDS, self._group(request.group).query(GroupWorkflow.history)
        )
        return messages.group_history(history)

    @rpc
    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: Context
    ) -> pb.ListGroupsResponse:
        groups = await within(MESSAGE_SECONDS, running_groups(self._client))
        visible = self._access.visible(context, groups)
        return pb.ListGroupsResponse(groups=await listed_statuses(self._client, visible))

    @rpc
    async def ListNodes(
        self, request: pb.ListNodesRequest, context: Context
    ) -> pb.ListNodesResponse:
        self._access.caller(context)
        return pb.ListNodesResponse(nodes=[messages.node_status(n) for n in await self._nodes()])

    def _registry(self) -> Any:
        return self._client.get_workflow_handle_for(
            NodeRegistryWorkflow.run, NODE_REGISTRY_WORKFLOW_ID
        )

    async def _nodes(self) -> list[NodeRecord]:
        return await within(MESSAGE_SECONDS, registered_nodes(self._client))

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
        self._access.require(context, request.group, operator=True)
        handle = self._group(request.group)
        reason = convert.reason(request.reason) or "evicted by an operator"
        message = messages.event_of(ev.Evict, request, reason=reason)
        await within(MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.evict, message))
        return messages.group_status(
            await within(MESSAGE_SECONDS, handle.query(GroupWorkflow.status))
        )

    @rpc
    async def Pause(self, request: pb.PauseRequest, context: Context) -> pb.GroupStatus:
        self._access.require(context, request.group, operator=True)
        handle = self._group(request.group)
        message = messages.event_of(ev.Pause, request)
        status = await within(MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.pause, message))
        return messages.group_status(status)

    @rpc
    async def Drain(self, request: pb.DrainRequest, context: Context) -> pb.DrainResponse:
        self._access.require(context, None, operator=True)
        message = messages.event_of(ev.Drain, request)
        told = []
        for group in await within(MESSAGE_SECONDS, running_groups(self._client)):
            drain = group_handle(self._client, group).execute_update(GroupWorkflow.drain, message)
            told.append((await within(MESSAGE_SECONDS, drain)).group)
        with contextlib.suppress(RPCError):  # no registry yet: nothing to mark
            await within(
                MESSAGE_SECONDS, self._registry().signal(NodeRegistryWorkflow.set_drained, message)
            )
        return pb.DrainResponse(groups=sorted(told))


class GatewayOptions(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    temporal: TemporalSettings
    security: GatewaySecurity
    llmd_compat: CompatSettings | None = None
    max_groups: int = Field(default=DEFAULT_MAX_GROUPS, ge=1)


async def serve_gateway(
    stop: asyncio.Event, options: GatewayOptions, telemetry: Telemetry | None = None
) -> None:
    security = options.security
    security.check()
    if options.llmd_compat is not None and security.access().enforced:
        raise StartupError(
            "--llmd-compat cannot check bearer tokens (the llm-d API has no place for them); "
            "use --tls-client-ca for callers, or run the compat service on 127.0.0.1"
        )
    access = security.access()
    credentials = security.server_credentials()
    security.warn_if_insecure()
    telemetry = telemetry or Telemetry()
    client = await wait_for_temporal(options.temporal, "gateway", stop, telemetry)
    telemetry.start()
    server = grpc.aio.server(
        interceptors=[aio_server_interceptor()],  # type: ignore[no-untyped-call]
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    clock = ServerClock()
    service = TimeSlicerService(client, access, options.max_groups, clock)
    pb_grpc.add_TimeSlicerServicer_to_server(service, server)
    services = [SERVICE_NAME]
    if options.llmd_compat is not None:
        compat = TimeSliceOrchestratorCompat(client, options.llmd_compat, clock)
        llmd_grpc.add_TimeSliceOrchestratorServiceServicer_to_server(compat, server)
        services.append(LLMD_SERVICE_NAME)
        log_llmd_compat(options.llmd_compat)
    health_service = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    reflection.enable_server_reflection([*services, health_name, reflection.SERVICE_NAME], server)
    listen = security.listen
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        raise StartupError(
            f"cannot listen on {listen}: the address is in use or invalid; "
            "stop the other gateway or pass --listen HOST:PORT"
        )
    await server.start()
    await health_service.set("", health_pb2.HealthCheckResponse.SERVING)
    for name in services:
        await health_service.set(name, health_pb2.HealthCheckResponse.SERVING)
    transport = "TLS" if credentials is not None else "plain text"
    callers = ", bearer tokens" if access.enforced else ""
    callers += ", client certificates" if security.tls_client_ca else ""
    ready(
        "gateway",
        f"{listen} ({transport}{callers}; gRPC {', '.join(services)}), "
        f"Temporal {options.temporal.describe()}",
    )
    await stop.wait()
    await health_service.enter_graceful_shutdown()
    await server.stop(grace=5)
    await telemetry.close()
