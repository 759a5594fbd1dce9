"""Conversions between the gRPC messages and the shared pydantic models."""

from __future__ import annotations

import math

from timeshare.models import GroupStatus, NodeRecord
from timeshare.names import check_name
from timeshare.v1 import timeshare_pb2 as pb
from workers.gateway_errors import InvalidRequest

MAX_ACQUIRE_TIMEOUT_SECONDS = 7 * 24 * 3600.0


def name(kind: str, value: str) -> str:
    try:
        return check_name(kind, value)
    except ValueError as error:
        raise InvalidRequest(str(error)) from None


def acquire_timeout(requested: float, time_remaining: float | None) -> float:
    """Seconds the workflow may keep the acquire waiting; 0 for no limit."""
    if math.isnan(requested) or requested < 0 or requested > MAX_ACQUIRE_TIMEOUT_SECONDS:
        raise InvalidRequest(
            f"timeout_seconds must be between 0 and {MAX_ACQUIRE_TIMEOUT_SECONDS:g}, "
            f"got {requested}"
        )
    if time_remaining is None:
        return requested
    # Leave the waiter's own deadline a moment to report DEADLINE_EXCEEDED.
    by_deadline = max(0.001, time_remaining - 0.2)
    return min(requested, by_deadline) if requested > 0 else by_deadline


def group_status(status: GroupStatus) -> pb.GroupStatus:
    return pb.GroupStatus(
        group=status.group,
        state=status.state,
        holder=status.holder,
        epoch=status.epoch,
        queue=status.queue,
        jobs=[
            pb.JobStatus(
                job=job.job,
                nodes=job.nodes,
                turns=job.turns,
                waited_seconds=job.waited_seconds,
                held_seconds=job.held_seconds,
            )
            for job in status.jobs
        ],
        residency=[pb.Residency(node=node, job=job) for node, job in status.resident.items()],
        switches=status.switches,
        grants=status.grants,
        switch_seconds_total=status.switch_seconds_total,
        degraded_cause=status.degraded_cause,
    )


def node_status(record: NodeRecord) -> pb.NodeStatus:
    return pb.NodeStatus(
        node=record.node,
        backend=record.backend,
        simulated=record.simulated,
        alive=record.alive,
        last_seen=record.last_seen,
        gpus=record.gpus,
    )
