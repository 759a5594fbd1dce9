"""The floor workflow's worker in a process of its own, as the scheduler
worker runs in its own: its CPU, read from /proc, is then comparable with the
scheduler's (see bench.floors.measure_floor_cpu).

    python -m bench.floor_worker --temporal HOST:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from temporalio.worker import Worker

from bench.floors import READY_LINE, WORKFLOW_QUEUE, FloorWorkflow
from timeshare.workers.children import die_with_parent_if_asked
from timeshare.workers.service import connect_temporal


async def serve(temporal: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    client = await connect_temporal(temporal, "default")
    async with Worker(client, task_queue=WORKFLOW_QUEUE, workflows=[FloorWorkflow]):
        print(READY_LINE, flush=True)
        await stop.wait()


def main() -> None:
    die_with_parent_if_asked()
    parser = argparse.ArgumentParser(description="The floor workflow's worker.")
    parser.add_argument("--temporal", required=True, help="the Temporal frontend, HOST:PORT")
    asyncio.run(serve(parser.parse_args().temporal))


if __name__ == "__main__":
    main()
