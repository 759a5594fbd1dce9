"""Between the public API's protobuf messages and what the group workflow
takes and answers, in one table: a request becomes the scheduling core's
event (timeshare/scheduling/events.py) field by field of the event, each
field read from the request's field of the same name (or the one named in
SOURCES) and checked by its entry in CHECKS; an answer becomes its protobuf
response field by field of the response, from the attribute of the same
name (or one the call renames). No call site converts a field by hand."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

from timeshare.credentials import token_hash
from timeshare.history import GroupHistory
from timeshare.models import GroupStatus, NodeRecord
from timeshare.scheduling.watch import HolderNotice
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workers.gateway import convert

Event = TypeVar("Event")
Response = TypeVar("Response", bound=Message)

# Where an event's field comes from, where the request names it otherwise.
SOURCES = {"token_hash": "job_token"}
# How each field is checked (InvalidRequest) or derived on its way in.
CHECKS: dict[str, Callable[[Any], Any]] = {
    "job": partial(convert.name, "job"),
    "node": partial(convert.name, "node"),
    "nodes": convert.nodes,
    "phase": convert.phase,
    "request_id": convert.request_id,
    "reason": convert.reason,
    "weight": convert.weight,
    "priority": convert.priority,
    # Tokens cross the boundary only as hashes.
    "token_hash": token_hash,
}


def event_of(kind: type[Event], request: Message, **given: Any) -> Event:
    """The event ``kind`` a request asks for: each of its fields from
    ``given``, else from the request (checked), else its default."""
    present = request.DESCRIPTOR.fields_by_name
    values: dict[str, Any] = {}
    for field in dataclasses.fields(kind):  # type: ignore[arg-type]
        source = SOURCES.get(field.name, field.name)
        if field.name in given:
            values[field.name] = given[field.name]
        elif source in present:
            values[field.name] = CHECKS.get(field.name, _as_is)(getattr(request, source))
    return kind(**values)


def reply(
    kind: type[Response], answer: object, renamed: dict[str, str] | None = None, **given: Any
) -> Response:
    """The response ``kind`` to an answer: each of its fields from ``given``,
    else from the answer's attribute of the same name (or the one
    ``renamed`` names)."""
    renamed = renamed or {}
    values = dict(given)
    for name in kind.DESCRIPTOR.fields_by_name:
        attribute = renamed.get(name, name)
        if name not in given and hasattr(answer, attribute):
            values[name] = getattr(answer, attribute)
    return kind(**values)


def _as_is(value: Any) -> Any:
    return value


def group_status(status: GroupStatus) -> pb.GroupStatus:
    return reply(
        pb.GroupStatus,
        status,
        jobs=[reply(pb.JobStatus, job) for job in status.jobs],
        residency=[pb.Residency(node=node, job=job) for node, job in status.resident.items()],
        policy=pb.GroupPolicy(**status.policy.model_dump()),
    )


def group_history(history: GroupHistory) -> pb.GroupHistory:
    return json_format.ParseDict(history.model_dump(), pb.GroupHistory())


def node_status(record: NodeRecord) -> pb.NodeStatus:
    return reply(pb.NodeStatus, record)


def turn_notice(notice: HolderNotice) -> pb.TurnNotice:
    return reply(pb.TurnNotice, notice)
