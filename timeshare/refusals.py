"""The one vocabulary of refusals: why the scheduler turned a message down.

The pure queue raises them, the group workflow carries them as the type of a
non-retryable ApplicationError, the gateway maps them to the gRPC status of the
same name and the client library raises the matching error class. Values are
gRPC status names, and they are what recorded workflow histories hold, so a
value never changes."""

from __future__ import annotations

from enum import StrEnum


class Refusal(StrEnum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    ABORTED = "ABORTED"
    # The scheduler met an error of its own while handling the message; the
    # group's state is as it was before the message.
    INTERNAL = "INTERNAL"
