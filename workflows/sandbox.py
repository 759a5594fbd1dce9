"""The runner the group workflows run in: the SDK's sandbox, or none.

The scheduler runs them outside the sandbox by default. In the sandbox every
call into workflow code is an ``exec`` and every payload visit asks it for
its serialization context: about a third of the scheduler's Python time per
hand-over (docs/benchmarks.md, "Scale"). What the sandbox guards against,
workflow code reaching for I/O, clocks, randomness or module state, is kept
out by the code's own rules (workflow modules hold no mutable module state
and call only ``workflow.*`` for time and randomness) and checked where the
sandbox does run: the test suite's workers and every replay
(tests/integration/test_replay.py, `timeshare scheduler --workflow-sandbox`).

In the sandbox: installed, the workflows are modules of the ``timeshare``
package, whose ``__init__`` imports the client library and its pydantic
models. Left to itself, the sandbox would import those models afresh for
each run while the passed-through lock queue keeps the originals, and
pydantic then refuses a ``GroupPolicy`` of the other class. Every
``timeshare`` module is deterministic at import time (no I/O, clocks or
randomness), so all of them are passed through.
"""

from __future__ import annotations

from temporalio.worker import UnsandboxedWorkflowRunner, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions


def workflow_runner(sandboxed: bool = True) -> WorkflowRunner:
    if not sandboxed:
        return UnsandboxedWorkflowRunner()
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("timeshare")
    )
