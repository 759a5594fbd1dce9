"""The checks a request's fields pass on their way in (InvalidRequest where
one fails); messages.py applies them, field by field of each event."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import ValidationError

from timeshare._protocol import policy_fields
from timeshare.models import PRIORITY_LIMIT, GroupPolicy, check_phase
from timeshare.names import check_name
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workers.gateway.errors import InvalidRequest

MAX_ACQUIRE_TIMEOUT_SECONDS = 7 * 24 * 3600.0
MAX_NODES_PER_JOB = 256
MAX_REQUEST_ID_CHARS = 128
MAX_REASON_CHARS = 1024


def name(kind: str, value: str) -> str:
    try:
        return check_name(kind, value)
    except ValueError as error:
        raise InvalidRequest(str(error)) from None


def nodes(values: Sequence[str]) -> list[str]:
    if len(values) > MAX_NODES_PER_JOB:
        raise InvalidRequest(f"nodes: at most {MAX_NODES_PER_JOB} per job, got {len(values)}")
    checked = [name("node", node) for node in values]
    if len(set(checked)) != len(checked):
        raise InvalidRequest(f"nodes: {checked} names a node twice")
    return checked


def request_id(value: str) -> str:
    if len(value) > MAX_REQUEST_ID_CHARS or not value.isprintable():
        raise InvalidRequest(
            f"request_id: at most {MAX_REQUEST_ID_CHARS} printable characters, "
            f"got {len(value)} characters"
        )
    return value


def reason(value: str) -> str:
    if len(value) > MAX_REASON_CHARS or not value.isprintable():
        raise InvalidRequest(f"reason: at most {MAX_REASON_CHARS} printable characters")
    return value


def phase(value: str) -> str:
    try:
        return check_phase(value)
    except ValueError as error:
        raise InvalidRequest(str(error)) from None


def weight(value: float) -> float:
    """0 (unset) is the default weight, 1."""
    if value == 0:
        return 1.0
    if math.isnan(value) or not 0 < value <= 1000:
        raise InvalidRequest(f"weight must be above 0 and at most 1000, got {value}")
    return value


def priority(value: int) -> int:
    if abs(value) > PRIORITY_LIMIT:
        raise InvalidRequest(f"priority must be within ±{PRIORITY_LIMIT}, got {value}")
    return value


def policy(message: pb.GroupPolicy) -> GroupPolicy:
    """A policy from the wire: fields left at 0 (or "", or empty) keep their defaults."""
    try:
        return GroupPolicy.model_validate(policy_fields(message))
    except ValidationError as error:
        problem = error.errors()[0]
        field = ".".join(str(part) for part in problem["loc"])
        raise InvalidRequest(f"policy.{field}: {problem['msg']}") from None


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
