"""Temporal's own update-plus-activity floor, hop by hop, in fresh worker processes.

Temporal's own floor, hop by hop, in fresh worker processes: how long an
update awaiting one activity takes (bench.parts.floors' FloorWorkflow), and, from
its history, the two dispatches inside it: the activity's (scheduled to
started) and the workflow task's after the activity (completed to the next
task started). Each run is a new process with its own workers and connection
to one embedded server, so the spread between runs is the server's and the
SDK's, with none of timeshare's code in the path.

    python -m bench floor_hops            # 4 runs of 30 updates
    python -m bench floor_hops --runs 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence

from temporalio.api.enums.v1 import EventType
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.parts.floors import ACTIVITY_QUEUE, WORKFLOW_QUEUE, FloorWorkflow, start_floor
from bench.parts.handover_floors import floor_noop
from timeshare.status import table
from timeshare.testing import temporal_only
from timeshare.workers.common.service import connect_temporal

RESULT_PREFIX = "floor hops:"


async def one_run(address: str, iterations: int) -> tuple[float, float, float]:
    """(update+activity p50, activity dispatch p50, dispatch back p50), ms."""
    client = await connect_temporal(address, "default")
    queue = f"{WORKFLOW_QUEUE}-{uuid.uuid4().hex[:6]}"
    async with (
        Worker(client, task_queue=queue, workflows=[FloorWorkflow],
               workflow_runner=UnsandboxedWorkflowRunner()),
        Worker(client, task_queue=ACTIVITY_QUEUE, activities=[floor_noop]),
    ):  # fmt: skip
        handle = await start_floor(client, queue)
        for _ in range(3):
            await handle.execute_update(FloorWorkflow.via_activity)  # warm up
        timings = []
        for _ in range(iterations):
            started = time.perf_counter()
            await handle.execute_update(FloorWorkflow.via_activity)
            timings.append((time.perf_counter() - started) * 1000)
        await handle.signal(FloorWorkflow.finish)
        await handle.result()
        events = [
            (event.event_time.ToMicroseconds() / 1000, event.event_type)
            async for event in handle.fetch_history_events()
        ]
    dispatch = hops(events, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                    EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)  # fmt: skip
    back = hops(events, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
                EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED)  # fmt: skip
    return statistics.median(timings), statistics.median(dispatch), statistics.median(back)


def hops(events: Sequence[tuple[float, int]], start: int, end: int) -> list[float]:
    """Milliseconds from each ``start`` event to the first ``end`` after it."""
    found = []
    for index, (at, kind) in enumerate(events):
        if kind == start:
            after = next((t for t, k in events[index + 1 :] if k == end), None)
            if after is not None:
                found.append(after - at)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description="Temporal's floor, hop by hop, run by run.")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--one", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        total, dispatch, back = asyncio.run(one_run(args.one, args.iterations))
        print(f"{RESULT_PREFIX} {total:.1f} {dispatch:.1f} {back:.1f}", flush=True)
        return
    rows = []
    with temporal_only() as stack:
        for run in range(args.runs):
            one = subprocess.run(
                [sys.executable, "-m", "bench", "floor_hops", f"--one={stack.temporal}",
                 f"--iterations={args.iterations}"],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            line = next((x for x in one.stdout.splitlines() if x.startswith(RESULT_PREFIX)), "")
            if not line:
                raise RuntimeError(f"run {run + 1} failed: {one.stderr[-800:]}")
            figures = line.removeprefix(RESULT_PREFIX).split()
            rows.append([str(run + 1), *figures])
            print(f"run {run + 1}: {' '.join(figures)}", flush=True)
    print()
    print(table(["run (new process)", "update+activity p50 ms", "activity dispatch p50 ms",
                 "dispatch back p50 ms"], rows))  # fmt: skip
    totals = [float(row[1]) for row in rows]
    print(f"runs={len(rows)} floor_activity_ms_min={min(totals):.1f} "
          f"floor_activity_ms_max={max(totals):.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
