"""timeshare: cooperative GPU time-slicing for RL jobs.

    import timeshare
    job = timeshare.connect().join("grpo-pair", "job-a")
    with job.turn():
        trainer.step()

This package is what RL jobs import; it needs only grpcio, protobuf and
pydantic, never temporalio.
"""

from importlib.metadata import PackageNotFoundError, version

from timeshare._protocol import Turn
from timeshare.client import Client, Job, acquire_all, connect
from timeshare.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SwitchFailed,
    TimeshareError,
    Unauthenticated,
    Unavailable,
)

try:
    __version__ = version("timeshare")
except PackageNotFoundError:  # imported from a tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Aborted",
    "Client",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "Job",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "SwitchFailed",
    "TimeshareError",
    "Turn",
    "Unauthenticated",
    "Unavailable",
    "__version__",
    "acquire_all",
    "connect",
]
