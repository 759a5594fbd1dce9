"""The floor workflow's worker in a process of its own, as the scheduler
worker runs in its own: its CPU, read from /proc, is then comparable with the
scheduler's (see bench.floors.measure_floor_cpu).

    python -m bench.floor_worker --temporal HOST:PORT [--sandboxed | --inline] [--task-queue Q]
        [--data-converter sdk|timeshare]

It also serves the hand-over-shaped layers of bench.handover_floors, the
group layer's GroupWorkflow among them; each floor or layer that runs beside
another is given a ``--task-queue`` of its own, so that each worker's CPU is
its own floor's.

The floor workflow runs unsandboxed (the SDK's own floor), or with
``--sandboxed`` in a sandbox like the scheduler's, to tell what the sandbox
itself costs. Its activations run on the SDK's thread pool, as the SDK's
defaults have it, or with ``--inline`` on the event loop, as the scheduler
runs them (timeshare.workers.scheduler.activations_inline). It converts
payloads with the SDK's own pydantic data converter, as the floor is the
SDK's cost; the group layer, which stands for the scheduler, asks for
timeshare's (``--data-converter timeshare``, timeshare.workers.data_converter),
and with it the scheduler's one-at-a-time external-storage visits
(timeshare.workers.scheduler.external_storage_concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from bench.floors import READY_LINE, WORKFLOW_QUEUE, FloorWorkflow
from bench.handover_floors import HandOverFloorWorkflow, MessagesFloorWorkflow
from timeshare.workers.children import die_with_parent_if_asked
from timeshare.workers.data_converter import DATA_CONVERTER
from timeshare.workers.scheduler import (
    external_storage_concurrency,
    sdk_external_storage_concurrency,
)
from timeshare.workers.service import connect_temporal
from timeshare.workflows.group import GroupWorkflow

DATA_CONVERTERS: dict[str, DataConverter] = {
    "sdk": pydantic_data_converter,
    "timeshare": DATA_CONVERTER,
}


def runner(sandboxed: bool) -> SandboxedWorkflowRunner | UnsandboxedWorkflowRunner:
    """The scheduler's sandbox (timeshare.workflows.sandbox: every timeshare
    module passed through, as here the benchmark's), or none."""
    if not sandboxed:
        return UnsandboxedWorkflowRunner()
    restrictions = SandboxRestrictions.default.with_passthrough_modules("timeshare", "bench")
    return SandboxedWorkflowRunner(restrictions=restrictions)


async def serve(
    temporal: str, sandboxed: bool, inline: bool, task_queue: str, data_converter: str
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    converter = DATA_CONVERTERS[data_converter]
    client = await connect_temporal(temporal, "default", data_converter=converter)
    storage = (
        external_storage_concurrency(converter)
        if converter is DATA_CONVERTER
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
        "--data-converter", choices=sorted(DATA_CONVERTERS), default="sdk",
        help="the SDK's pydantic data converter (the floor's), or timeshare's with the "
        "scheduler's external-storage visits",
    )  # fmt: skip
    args = parser.parse_args()
    if args.sandboxed and args.inline:
        parser.error("--inline runs outside the sandbox, as the scheduler does")
    asyncio.run(
        serve(args.temporal, args.sandboxed, args.inline, args.task_queue, args.data_converter)
    )


if __name__ == "__main__":
    main()
