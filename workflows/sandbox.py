"""The sandbox every worker and replayer runs the group workflows in.

Installed, the workflows are modules of the ``timeshare`` package, whose
``__init__`` imports the client library and its pydantic models. Left to
itself, the sandbox would import those models afresh for each run while the
passed-through lock queue keeps the originals, and pydantic then refuses a
``GroupPolicy`` of the other class. Every ``timeshare`` module is
deterministic at import time (no I/O, clocks or randomness), so all of them
are passed through.
"""

from __future__ import annotations

from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions


def workflow_runner() -> SandboxedWorkflowRunner:
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("timeshare")
    )
