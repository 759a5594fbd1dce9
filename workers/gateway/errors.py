"""How the gateway turns every failure into a gRPC status with a clear message."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from temporalio.client import (
    RPCTimeoutOrCancelledError,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from timeshare.errors import SWITCH_FAILED_METADATA
from timeshare.refusals import Refusal

log = logging.getLogger("timeshare.gateway")

# A workflow refusal (ApplicationError.type) is the gRPC status of its name.
REPORTABLE = {refusal.value: grpc.StatusCode[refusal.value] for refusal in Refusal}


# How Temporal says a workflow's last task failed (a scheduler bug, or a
# history that the scheduler's code cannot replay).
STUCK_WORKFLOW = "Workflow Task in failed state"
# ... and how it refuses an update while a failed task is retried: also seen
# for a few seconds after a Temporal restart, when a task that completed an
# update before the restart is completed again and refused.
RETRIED_WORKFLOW_TASK = "unexpected workflow task failure"


# How Temporal answers an update that was waiting for a workflow task when
# the run ended (continued as new, or replaced by a healed run): the message
# was never handled, and the group's current run takes it.
# (or, for one sent as the run ended, that it is "already completed").
RUN_CLOSED_UNDER_UPDATE = ("update was aborted by closing workflow", "execution already completed")


def run_closed_under_update(error: BaseException) -> bool:
    if not isinstance(error, RPCError):
        return False
    return any(sign in error.message.lower() for sign in RUN_CLOSED_UNDER_UPDATE)


def workflow_task_failed(error: BaseException) -> bool:
    """Temporal refused a message because the workflow's last task failed:
    transient after a restart, lasting where the scheduler cannot run it."""
    if not isinstance(error, RPCError):
        return False
    message = error.message.lower()
    return STUCK_WORKFLOW.lower() in message or RETRIED_WORKFLOW_TASK in message


# Short messages (join, yield, status) must be answered by then, or the
# scheduler worker is presumed down and the caller is told so.
MESSAGE_SECONDS = 30.0


class InvalidRequest(ValueError):
    """A request refused before it reaches Temporal."""


class AccessDenied(Exception):
    """The caller may not make this call (UNAUTHENTICATED or PERMISSION_DENIED)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class CallUnsupported(Exception):
    """The scheduler's workflow has no handler for the call (an older scheduler)."""


# How the SDK's worker refuses an update its workflow has no handler for.
UNKNOWN_UPDATE = "expected but not found"


def unknown_update(error: WorkflowUpdateFailedError) -> bool:
    return UNKNOWN_UPDATE in str(error.cause)


class SchedulerTimeout(Exception):
    """The scheduler did not answer a short message in time."""


Servicer = TypeVar("Servicer")
Request = TypeVar("Request")
Response = TypeVar("Response")
Method = Callable[[Servicer, Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[Response]]


def status_for(error: BaseException, group: str) -> tuple[grpc.StatusCode, str] | None:
    """The gRPC status for a failure, or None if it is not ours to translate."""
    if isinstance(error, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if isinstance(error, AccessDenied):
        return error.code, str(error)
    if isinstance(error, SchedulerTimeout):
        return grpc.StatusCode.UNAVAILABLE, str(error)
    if isinstance(error, RPCTimeoutOrCancelledError):
        # Temporal's own deadline on the call ran out (the gateway's caller
        # going away is a cancellation of the call, never answered).
        return (
            grpc.StatusCode.UNAVAILABLE,
            f"Temporal did not answer in time ({error}); retry, and check the Temporal "
            "server and `timeshare scheduler` are running",
        )
    if isinstance(error, CallUnsupported):
        return grpc.StatusCode.UNIMPLEMENTED, str(error)
    if isinstance(error, WorkflowUpdateFailedError | WorkflowQueryFailedError):
        cause = error.cause if isinstance(error, WorkflowUpdateFailedError) else None
        if isinstance(cause, ApplicationError) and cause.type in REPORTABLE:
            return REPORTABLE[cause.type], cause.message
        return grpc.StatusCode.INTERNAL, f"the scheduler failed: {cause or error}"
    if isinstance(error, RPCError):
        if error.status in (RPCStatusCode.INVALID_ARGUMENT, RPCStatusCode.RESOURCE_EXHAUSTED):
            return REPORTABLE[error.status.name], f"Temporal refused the call: {error.message}"
        if run_closed_under_update(error):
            return (
                grpc.StatusCode.UNAVAILABLE,
                f"group {group!r}'s run ended while the call waited (it continued as new, or "
                "its scheduler healed it in a new run); retry: the new run takes it",
            )
        if error.status == RPCStatusCode.NOT_FOUND:
            return (
                grpc.StatusCode.NOT_FOUND,
                f"group {group!r} does not exist; Join creates it",
            )
        if STUCK_WORKFLOW in error.message:
            return grpc.StatusCode.UNAVAILABLE, stuck_group_message(group)
        return (
            grpc.StatusCode.UNAVAILABLE,
            f"Temporal refused the call ({error.status.name}: {error.message}); retry, "
            "and check the Temporal server and `timeshare scheduler` are running",
        )
    return None


def trailing_metadata_for(error: BaseException) -> tuple[tuple[str, str], ...]:
    """What a typed client error carries beside the status: the job and cause
    of a switch that could not be made (timeshare.errors.SwitchFailed)."""
    cause = error.cause if isinstance(error, WorkflowUpdateFailedError) else None
    if not isinstance(cause, ApplicationError) or cause.type != Refusal.ABORTED:
        return ()
    details = cause.details[0] if cause.details else None
    if not isinstance(details, dict) or not {"job", "cause"} <= details.keys():
        return ()
    fields = {"job": str(details["job"]), "cause": str(details["cause"])}
    return ((SWITCH_FAILED_METADATA, json.dumps(fields)),)


def stuck_group_message(group: str) -> str:
    return (
        f"group {group!r} is stuck for now: the scheduler fails its workflow task. It heals "
        "such a group by itself, in a new run that keeps its queue, holder and parked state, "
        "within about 30 s, and the client sends the call again meanwhile; if this lasts, "
        "see the `timeshare scheduler` log (a line 'group ... heals again in' says why)"
    )


def unexpected_failure(call: str, error: BaseException) -> str:
    """What the caller is told of a failure the gateway did not expect: its
    kind and message (grpc's own answer would say only "Unexpected <class>")."""
    return (
        f"the gateway failed on {call}: {type(error).__name__}: {error} "
        "(see the `timeshare gateway` log)"
    )


def caller_gone() -> bool:
    """Whether the call's task is being cancelled: its caller went away."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


# The failures status_for names.
EXPECTED = (InvalidRequest, AccessDenied, SchedulerTimeout, WorkflowUpdateFailedError,
            WorkflowQueryFailedError, RPCError, RPCTimeoutOrCancelledError)  # fmt: skip


def rpc(method: Method[Servicer, Request, Response]) -> Method[Servicer, Request, Response]:
    """Report every failure of a servicer method as a gRPC status that names
    its cause: an expected one as status_for says, any other as INTERNAL."""

    @functools.wraps(method)
    async def wrapper(
        self: Servicer, request: Request, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Response:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise  # the method's own answer, already given
        except EXPECTED as error:
            status = status_for(error, getattr(request, "group", ""))
            assert status is not None
            await context.abort(*status, trailing_metadata=trailing_metadata_for(error))
            raise  # unreachable: abort raises
        except Exception as error:
            log.exception("%s failed", method.__name__)
            answer = unexpected_failure(method.__name__, error)
            await context.abort(grpc.StatusCode.INTERNAL, answer)
            raise  # unreachable: abort raises

    return wrapper


async def within(seconds: float, call: Awaitable[Response]) -> Response:
    """Await a message to the scheduler that should answer promptly."""
    try:
        return await asyncio.wait_for(call, seconds)
    except TimeoutError:
        raise SchedulerTimeout(
            f"the scheduler did not answer within {seconds:g} s: "
            "check that `timeshare scheduler` is running"
        ) from None
