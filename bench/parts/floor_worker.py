"""The floor workflow's worker in a process of its own, as the scheduler
worker runs in its own: its CPU, read from /proc, is then comparable with the
scheduler's (see bench.parts.floors.measure_floor_cpu).

    python -m bench.parts.floor_worker --temporal HOST:PORT [--sandboxed | --inline]
        [--task-queue Q] [--settings sdk|scheduler]

It also serves the hand-over-shaped layers of bench.parts.handover_floors, the
group layer's GroupWorkflow among them; each floor or layer that runs beside
another is given a ``--task-queue`` of its own, so that each worker's CPU is
its own floor's.

The floor workflow runs unsandboxed (the SDK's own floor), or with
``--sandboxed`` in a sandbox like the scheduler's, to tell what the sandbox
itself costs. Its activations run on the SDK's thread pool, as the SDK's
defaults have it, or with ``--inline`` on the event loop, as the scheduler
runs them (timeshare.workers.scheduler.serve.activations_inline). Its client and
worker keep the SDK's defaults, as the floor is the SDK's cost: the SDK's
pydantic data converter, gzip on the wire, external-storage visits three at
a time. The group layer, which stands for the scheduler, asks for the
scheduler's own (``--settings scheduler``): timeshare's data converter
(timeshare.workers.scheduler.data_converter), no compression
(timeshare.workers.common.temporal_settings), one visit at a time
(timeshare.workers.scheduler.serve.external_storage_concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from bench.parts.floors import READY_LINE, WORKFLOW_QUEUE, FloorWorkflow
from bench.parts.handover_floors import HandOverFloorWorkflow, MessagesFloorWorkflow
from timeshare.workers.common.children import die_with_parent_if_asked
from timeshare.workers.common.service import connect_temporal
from timeshare.workers.common.temporal_settings import TemporalSettings
from timeshare.workers.scheduler.data_converter import DATA_CONVERTER
from timeshare.workers.scheduler.serve import (
    external_storage_concurrency,
    sdk_external_storage_concurrency,
)
from timeshare.workflows.group import GroupWorkflow

SETTINGS = ("sdk", "scheduler")


def runner(sandboxed: bool) -> SandboxedWorkflowRunner | UnsandboxedWorkflowRunner:
    """The scheduler's sandbox (timeshare.workflows.sandbox: every timeshare
    module passed through, as here the benchmark's), or none."""
    if not sandboxed:
        return UnsandboxedWorkflowRunner()
    restrictions = SandboxRestrictions.default.with_passthrough_modules("timeshare", "bench")
    return SandboxedWorkflowRunner(restrictions=restrictions)


async def serve(
    temporal: str, sandboxed: bool, inline: bool, task_queue: str, settings: str
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    as_scheduler = settings == "scheduler"
    converter = DATA_CONVERTER if as_scheduler else pydantic_data_converter
    # The scheduler's compression, or the SDK's default.
    connection = TemporalSettings(address=temporal, compression="none" if as_scheduler else "gzip")
    client = await connect_temporal(connection, data_converter=converter)
    storage = (
        external_storage_concurrency(converter)
        if as_scheduler
        else sdk_external_storage_concurrency()
    )
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[FloorWorkflow, HandOverFloorWorkflow, MessagesFloorWorkflow, GroupWorkflow],
        workflow_runner=runner(sandboxed),
        debug_mode=inline,
        max_workflow_task_external_storage_concurrency=storage,
    ):
        print(READY_LINE, flush=True)
        await stop.wait()


def main() -> None:
    die_with_parent_if_asked()
    parser = argparse.ArgumentParser(description="The floor workflow's worker.")
    parser.add_argument("--temporal", required=True, help="the Temporal frontend, HOST:PORT")
    parser.add_argument("--sandboxed", action="store_true", help="in the scheduler's sandbox")
    parser.add_argument(
        "--inline", action="store_true", help="activations on the event loop, as the scheduler's"
    )
    parser.add_argument(
        "--task-queue", default=WORKFLOW_QUEUE,
        help="its own queue where two floors run side by side (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--settings", choices=SETTINGS, default="sdk",
        help="the client's and worker's: the SDK's defaults (the floor's), or the scheduler's",
    )  # fmt: skip
    args = parser.parse_args()
    if args.sandboxed and args.inline:
        parser.error("--inline runs outside the sandbox, as the scheduler does")
    asyncio.run(serve(args.temporal, args.sandboxed, args.inline, args.task_queue, args.settings))


if __name__ == "__main__":
    main()
