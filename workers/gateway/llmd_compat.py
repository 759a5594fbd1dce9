"""The llm-d time-slicing orchestrator API (timeslice_orchestrator.v1alpha1),
served by the gateway with --llmd-compat so that llm-d's clients work against
timeshare unchanged. Its clients send no job token, so the gateway holds one
per job itself, and serves only the networks and groups the operator allows.

A GPU belongs to one group at a time, for llm-d's groups as for timeshare's:
a job's first call claims its group's GPUs (those --llmd-gpus places the group
on, else all of its node's), and a group that would share one with another is
refused then, with FAILED_PRECONDITION, never admitted and then aborted when
its state cannot be restored beside the other's.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import secrets
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any

import grpc
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from timeshare.credentials import llmd_job_token, token_hash
from timeshare.models import Grant, GroupPolicy
from timeshare.names import check_name
from timeshare.refusals import Refusal
from timeshare.scheduling import events as ev
from timeshare.v1 import llmd_compat_pb2 as llmd
from timeshare.v1 import llmd_compat_pb2_grpc as llmd_grpc
from timeshare.workers.gateway import convert
from timeshare.workers.gateway.claims import join_claiming_gpus
from timeshare.workers.gateway.errors import MESSAGE_SECONDS, InvalidRequest, rpc, within
from timeshare.workers.gateway.group_client import (
    GroupHandle,
    acquire_or_withdraw,
    group_handle,
    registered_nodes,
    running_groups,
)
from timeshare.workers.gateway.llmd_placement import FLAG as PLACEMENT_FLAG
from timeshare.workers.gateway.llmd_placement import LlmdPlacement, parse_placements, placement_for
from timeshare.workers.gateway.llmd_status import group_status_response
from timeshare.workers.gateway.server_clock import ServerClock
from timeshare.workflows.group import GroupWorkflow

Context = grpc.aio.ServicerContext[Any, Any]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
SERVICE_NAME = llmd.DESCRIPTOR.services_by_name["TimeSliceOrchestratorService"].full_name
LOOPBACK = ("127.0.0.0/8", "::1/128")
# llm-d clients never heartbeat: the lease of a group they create must outlast
# their longest GPU phase.
DEFAULT_LEASE_SECONDS = 3600.0
SECRET_ENV = "TIMESHARE_LLMD_SECRET"


@dataclass
class CompatSettings:
    # None: every group; else only these.
    groups: frozenset[str] | None = None
    allow: list[Network] = field(
        default_factory=lambda: [ipaddress.ip_network(n) for n in LOOPBACK]
    )
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    # Derives each job's token; gateway replicas must share it (env TIMESHARE_LLMD_SECRET).
    secret: bytes = field(
        default_factory=lambda: os.environ.get(SECRET_ENV, "").encode() or secrets.token_bytes(32)
    )
    # Where groups go (--llmd-gpus); a group no value matches claims all
    # GPUs of its node.
    placements: list[LlmdPlacement] = field(default_factory=list)


def compat_settings(
    groups: str | None,
    allow: list[str] | None,
    lease_seconds: float,
    gpus: list[str] | None = None,
) -> CompatSettings:
    """Settings from the gateway's flags; ValueError names the bad one."""
    chosen = None
    if groups:
        chosen = frozenset(check_name("group", g.strip()) for g in groups.split(",") if g.strip())
    networks = []
    for cidr in allow or LOOPBACK:
        try:
            networks.append(ipaddress.ip_network(cidr))
        except ValueError as error:
            raise ValueError(f"--llmd-compat-allow {cidr!r}: {error}") from None
    if not 1 <= lease_seconds <= 86400 * 7:
        raise ValueError(f"--llmd-compat-lease-seconds must be 1 to 604800, got {lease_seconds}")
    return CompatSettings(
        groups=chosen, allow=networks, lease_seconds=lease_seconds,
        placements=parse_placements(gpus),
    )  # fmt: skip


def log_llmd_compat(settings: CompatSettings) -> None:
    groups = ", ".join(sorted(settings.groups)) if settings.groups is not None else "every group"
    networks = ", ".join(str(n) for n in settings.allow)
    print(
        f"timeshare gateway: WARNING: llm-d compatibility is on for {groups}, from {networks}. "
        "Its clients send no job token: any caller from those networks can act as any job",
        flush=True,
    )
    placed = " ".join(p.describe() for p in settings.placements)
    print(
        f"timeshare gateway: llm-d groups placed on GPUs: {placed}" if placed else
        f"timeshare gateway: no {PLACEMENT_FLAG}: each llm-d group claims every GPU of its node",
        flush=True,
    )  # fmt: skip
    if not os.environ.get(SECRET_ENV):
        print(
            f"timeshare gateway: {SECRET_ENV} is not set: llm-d jobs' tokens are known only to "
            "this gateway replica; set it to the same secret on every replica",
            flush=True,
        )


def peer_address(peer: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address in a gRPC peer string: "ipv4:1.2.3.4:5", "ipv6:[::1]:5",
    or as grpcio writes it, "ipv6:%5B::1%5D:5". None for a Unix socket."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host = rest.rsplit(":", 1)[0].strip("[]").split("%")[0]  # drop a zone id
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class TimeSliceOrchestratorCompat(llmd_grpc.TimeSliceOrchestratorServiceServicer):
    def __init__(
        self, client: Client, settings: CompatSettings, clock: ServerClock | None = None
    ) -> None:
        self._client = client
        self._settings = settings
        # Shared with the gateway's own service, which learns it (server_clock.py).
        self._clock = clock or ServerClock()
        self._background: set[Any] = set()

    def _token_hash(self, group: str, job: str) -> str:
        # The job's token is derived, so that a job's node agents can check
        # its processes' registrations like any job's (`timeshare llmd-token`).
        return token_hash(llmd_job_token(self._settings.secret, group, job))

    async def _allowed(self, context: Context) -> None:
        peer = context.peer()
        address = peer_address(peer)
        unix = peer.startswith("unix:")
        if not unix and (address is None or not any(address in n for n in self._settings.allow)):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"llm-d compatibility is not served to {address or peer}; see --llmd-compat-allow",
            )

    async def _served(self, context: Context, group_id: str) -> str:
        await self._allowed(context)
        group = convert.name("group", group_id)
        if self._settings.groups is not None and group not in self._settings.groups:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"group {group!r} is not served through llm-d compatibility; "
                "see --llmd-compat-groups",
            )
        return group

    @rpc
    async def Acquire(self, request: llmd.AcquireRequest, context: Context) -> llmd.AcquireResponse:
        group = await self._served(context, request.group_id)
        job = convert.name("job", request.job_id)
        handle = group_handle(self._client, group)
        message = ev.Acquire(
            job=job,
            token_hash=self._token_hash(group, job),
            request_id=uuid.uuid4().hex,
            timeout_seconds=convert.acquire_timeout(0.0, context.time_remaining()),
        )
        try:
            grant = await acquire_or_withdraw(handle, message, self._background)
        except (WorkflowUpdateFailedError, RPCError) as refusal:
            if not await self._must_join(refusal, handle, job):
                raise
            await self._join(group, job, message.token_hash)
            # A new request: the refused one may be on record as aborted.
            retry = dataclasses.replace(message, request_id=uuid.uuid4().hex)
            grant = await acquire_or_withdraw(handle, retry, self._background)
        return acquire_response(grant)

    async def _must_join(
        self, refusal: WorkflowUpdateFailedError | RPCError, handle: GroupHandle, job: str
    ) -> bool:
        """Was the call refused because the job (or its group) is unknown, was
        evicted, or holds a token this gateway does not know (another secret,
        or a restart without TIMESHARE_LLMD_SECRET)? Then it is joined (again),
        as llm-d clients expect: they hold no token to lose."""
        if isinstance(refusal, RPCError):
            return refusal.status == RPCStatusCode.NOT_FOUND
        cause = refusal.cause
        if not isinstance(cause, ApplicationError):
            return False
        if cause.type == Refusal.UNAUTHENTICATED:
            return True
        if cause.type not in (Refusal.NOT_FOUND, Refusal.ABORTED):
            return False
        status = await within(MESSAGE_SECONDS, handle.query(GroupWorkflow.status))
        return job not in {j.job for j in status.jobs}

    async def _join(self, group: str, job: str, token_hash: str) -> None:
        """Join the job, once it has claimed its group's GPUs."""
        placement = placement_for(self._settings.placements, group)
        nodes = await self._nodes_for(group, placement)
        # llm-d's groups are FIFO, and its clients never renew a lease.
        lease = self._settings.lease_seconds
        policy = GroupPolicy(
            lease_seconds=lease, idle_lease_seconds=lease, ordering="fifo",
            gpus=placement.gpus if placement is not None else [],
        )  # fmt: skip
        remedy = (
            f"place the groups on GPUs of their own with the gateway's {PLACEMENT_FLAG} "
            "PATTERN=NODE:GPU[,GPU...], or call again once that claim has lapsed"
        )
        message = ev.Join(job=job, nodes=nodes, token_hash=token_hash)
        # A group that runs keeps the GPUs it was created with.
        await join_claiming_gpus(
            self._client, group, message, policy, remedy, clock=self._clock.now
        )

    async def _nodes_for(self, group: str, placement: LlmdPlacement | None) -> list[str]:
        """The group's nodes if its jobs agree on them, else the node
        --llmd-gpus places it on, else the only live node."""
        try:
            status = await within(MESSAGE_SECONDS, group_handle(self._client, group).query(
                GroupWorkflow.status))  # fmt: skip
            node_sets = {tuple(sorted(job.nodes)) for job in status.jobs}
            if len(node_sets) == 1:
                return list(node_sets.pop())
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
        if placement is not None:
            return [placement.node]
        nodes = await within(MESSAGE_SECONDS, registered_nodes(self._client))
        live = [n.node for n in nodes if n.alive]
        if len(live) != 1:
            raise InvalidRequest(
                f"cannot tell which nodes a new job of group {group!r} uses: the group has "
                f"no jobs that agree on their nodes and {len(live)} nodes are live; place the "
                f"group with the gateway's {PLACEMENT_FLAG} PATTERN=NODE:GPU[,GPU...], or join "
                "one job through the timeshare API first to set the group's nodes"
            )
        return live

    @rpc
    async def Yield(self, request: llmd.YieldRequest, context: Context) -> llmd.YieldResponse:
        group = await self._served(context, request.group_id)
        job = convert.name("job", request.job_id)
        handle: GroupHandle = group_handle(self._client, group)
        digest = self._token_hash(group, job)
        beat_message = ev.Heartbeat(job=job, token_hash=digest)
        try:
            beat = await within(
                MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.heartbeat, beat_message)
            )
        except (WorkflowUpdateFailedError, RPCError) as refusal:
            if not await self._must_join(refusal, handle, job):
                raise
            await self._join(group, job, digest)  # only the token was unknown
            beat = await within(
                MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.heartbeat, beat_message)
            )
        if not beat.holding:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"job {job!r} does not hold group {group!r}"
            )
        # The epoch the job was granted, also while it is preempted.
        message = ev.Yield(job=job, token_hash=digest, epoch=beat.epoch)
        await within(MESSAGE_SECONDS, handle.execute_update(GroupWorkflow.yield_turn, message))
        waiting = beat.waiting
        return llmd.YieldResponse(
            success=True, pending_waiters=waiting, snapshot_deferred=waiting == 0
        )

    @rpc
    async def ListGroups(
        self, request: llmd.ListGroupsRequest, context: Context
    ) -> llmd.ListGroupsResponse:
        await self._allowed(context)
        groups = await within(MESSAGE_SECONDS, running_groups(self._client))
        allowed = self._settings.groups
        return llmd.ListGroupsResponse(
            group_ids=sorted(g for g in groups if allowed is None or g in allowed)
        )

    @rpc
    async def GetGroupStatus(
        self, request: llmd.GetGroupStatusRequest, context: Context
    ) -> llmd.GetGroupStatusResponse:
        group = await self._served(context, request.group_id)
        query = group_handle(self._client, group).query(GroupWorkflow.status)
        return group_status_response(await within(MESSAGE_SECONDS, query))


def acquire_response(grant: Grant) -> llmd.AcquireResponse:
    return llmd.AcquireResponse(
        success=True,
        waited_ms=int(grant.waited_seconds * 1000),
        context_restored=grant.context_restored,
    )
