"""Errors the client library raises: one class per gRPC status it can meet."""

from __future__ import annotations

import json

import grpc

from timeshare.refusals import Refusal


class TimeshareError(Exception):
    """A call to timeshare failed; ``code`` is the gRPC status name."""

    code: str = "UNKNOWN"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(TimeshareError):
    code: str = Refusal.INVALID_ARGUMENT


class NotFound(TimeshareError):
    code: str = Refusal.NOT_FOUND


class Unauthenticated(TimeshareError):
    code: str = Refusal.UNAUTHENTICATED


class PermissionDenied(TimeshareError):
    code: str = Refusal.PERMISSION_DENIED


class FailedPrecondition(TimeshareError):
    code: str = Refusal.FAILED_PRECONDITION


class DeadlineExceeded(TimeshareError):
    code: str = Refusal.DEADLINE_EXCEEDED


class Aborted(TimeshareError):
    """The job was evicted or its state could not be restored."""

    code: str = Refusal.ABORTED


class SwitchFailed(Aborted):
    """The switch that would have given this job its turn kept failing and
    was given up: ``job`` names the job whose state could not be moved (this
    job's own where its state could not come back), ``cause`` what the node
    said. Acquire again once the cause is mended."""

    def __init__(self, message: str, job: str = "", cause: str = "") -> None:
        super().__init__(message)
        self.job = job
        self.cause = cause


# The trailing metadata key under which the gateway sends SwitchFailed's
# fields, as JSON: {"job": ..., "cause": ...}.
SWITCH_FAILED_METADATA = "timeshare-switch-failed"


class ResourceExhausted(TimeshareError):
    code: str = Refusal.RESOURCE_EXHAUSTED


class Internal(TimeshareError):
    """The scheduler failed on this message (the group is as it was before
    it), or the gateway did; the message names the failure."""

    code: str = Refusal.INTERNAL


class Unavailable(TimeshareError):
    """No gateway answers, or (``from_gateway``) the gateway answered that
    its Temporal or scheduler did not: a refusal that may pass."""

    code: str = "UNAVAILABLE"

    def __init__(self, message: str, from_gateway: bool = False) -> None:
        super().__init__(message)
        self.from_gateway = from_gateway


class Unimplemented(TimeshareError):
    """The gateway or the scheduler predates the call."""

    code: str = "UNIMPLEMENTED"


_BY_CODE: dict[str, type[TimeshareError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        Unauthenticated,
        PermissionDenied,
        FailedPrecondition,
        DeadlineExceeded,
        Aborted,
        ResourceExhausted,
        Internal,
        Unavailable,
        Unimplemented,
    )
}


# How grpc says a call ran past its own deadline (the gateway's answers say more).
GRPC_DEADLINE = "Deadline Exceeded"


def class_for_code(code: str) -> type[TimeshareError] | None:
    """The class of the error with gRPC status name ``code`` ("ABORTED"), if any."""
    return _BY_CODE.get(code)


def from_rpc_error(error: grpc.RpcError, address: str) -> TimeshareError:
    # Both grpc.Call (sync) and grpc.aio.AioRpcError carry code() and details().
    code_of = getattr(error, "code", None)
    details_of = getattr(error, "details", None)
    code = code_of() if callable(code_of) else grpc.StatusCode.UNKNOWN
    details = (details_of() if callable(details_of) else None) or str(error)
    if code == grpc.StatusCode.UNAVAILABLE:
        # Each of the gateway's own answers names the scheduler it relies on.
        if "scheduler" in details:
            return Unavailable(details, from_gateway=True)
        return Unavailable(
            f"no timeshare gateway answers at {address} ({details}); start one with "
            "`timeshare up`, or set TIMESHARE_ADDRESS"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and details == GRPC_DEADLINE:
        details = f"no answer from the gateway at {address} within the call's deadline"
    switch = _switch_failure(error) if code == grpc.StatusCode.ABORTED else None
    if switch is not None:
        return SwitchFailed(details, job=switch.get("job", ""), cause=switch.get("cause", ""))
    error_class = _BY_CODE.get(code.name, TimeshareError)
    result = error_class(details)
    if error_class is TimeshareError:
        result.code = code.name
    return result


def _switch_failure(error: grpc.RpcError) -> dict[str, str] | None:
    """SwitchFailed's fields from the call's trailing metadata, if it has them."""
    trailing = getattr(error, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == SWITCH_FAILED_METADATA:
            try:
                fields = json.loads(value)
            except (TypeError, ValueError):
                return None
            return {k: str(v) for k, v in fields.items()} if isinstance(fields, dict) else None
    return None
