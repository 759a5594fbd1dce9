"""Temporal's own floors on the same server, for comparison with timeshare's
hand-over: a trivial update round trip, and an update whose handler awaits one
activity on another task queue (what a one-node switch costs at least).

measure_floors times them from a worker in the benchmark's process;
measure_floor_cpu runs the workflow's worker in a process of its own
(bench.floor_worker), as the scheduler runs, and reads its CPU per update.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.procstat import cpu_seconds, tree_cpu_seconds
from bench.profiling import Profiler
from timeshare.workers.children import spawn, stop_process

WORKFLOW_QUEUE = "bench.floor"
ACTIVITY_QUEUE = "bench.floor.activity"
READY_SECONDS = 60.0
READY_LINE = "floor worker: ready"


@activity.defn(name="floor_noop")
async def floor_noop() -> None:
    return None


@workflow.defn(name="FloorWorkflow")
class FloorWorkflow:
    def __init__(self) -> None:
        self._done = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._done)

    @workflow.update
    def ping(self) -> None:
        return None

    @workflow.update
    async def via_activity(self) -> None:
        await workflow.execute_activity(
            "floor_noop", task_queue=ACTIVITY_QUEUE, start_to_close_timeout=timedelta(seconds=30)
        )

    @workflow.signal
    def finish(self) -> None:
        self._done = True


FLOORS = (("update", FloorWorkflow.ping), ("update+activity", FloorWorkflow.via_activity))


async def start_floor(
    client: Client, task_queue: str = WORKFLOW_QUEUE
) -> WorkflowHandle[FloorWorkflow, None]:
    return await client.start_workflow(
        FloorWorkflow.run, id=f"floor-{uuid.uuid4().hex[:8]}", task_queue=task_queue
    )


async def measure_floors(client: Client, iterations: int) -> dict[str, list[float]]:
    """Milliseconds per round trip of each floor."""
    timings: dict[str, list[float]] = {"update": [], "update+activity": []}
    async with (
        Worker(
            client,
            task_queue=WORKFLOW_QUEUE,
            workflows=[FloorWorkflow],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ),
        Worker(client, task_queue=ACTIVITY_QUEUE, activities=[floor_noop]),
    ):
        handle = await start_floor(client)
        for name, update in FLOORS:
            await handle.execute_update(update)  # warm up
            for _ in range(iterations):
                start = time.perf_counter()
                await handle.execute_update(update)
                timings[name].append((time.perf_counter() - start) * 1000)
        await handle.signal(FloorWorkflow.finish)
        await handle.result()
    return timings


@dataclass
class FloorCpu:
    """Milliseconds of the floor workflow worker's CPU per update, and of wall time."""

    update_cpu_ms: float
    activity_cpu_ms: float
    update_wall_ms: float
    activity_wall_ms: float
    # The Temporal server's CPU per update, where its process was named.
    server_update_cpu_ms: float = 0.0
    server_activity_cpu_ms: float = 0.0

    @property
    def per_handoff_floor_ms(self) -> float:
        # A hand-over is at least an update that returns at once (the yield)
        # and one that awaits a switch activity (the waiter's acquire).
        return self.update_cpu_ms + self.activity_cpu_ms

    @property
    def per_handoff_server_floor_ms(self) -> float:
        return self.server_update_cpu_ms + self.server_activity_cpu_ms


def start_floor_worker(
    temporal: str, log_path: Path, sandboxed: bool = False
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "bench.floor_worker", f"--temporal={temporal}"]
    if sandboxed:
        command.append("--sandboxed")
    with log_path.open("ab") as log:
        process = spawn(command, stdout=log, timeshare_child=True)
    deadline = time.monotonic() + READY_SECONDS
    while READY_LINE not in log_path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            raise RuntimeError(f"the floor worker did not start: {log_path.read_text()[-500:]}")
        time.sleep(0.1)
    return process


async def measure_floor_cpu(
    client: Client,
    temporal: str,
    iterations: int,
    workdir: Path,
    profile: Path | None = None,
    sandboxed: bool = False,
    server_pid: int | None = None,
) -> FloorCpu:
    """The floor workflow's worker runs in a process of its own, the activity's
    worker here (as the scheduler's activities run in the agent's process).
    ``profile``: py-spy the worker over the measured updates, to this file.
    ``sandboxed``: the workflow runs in a sandbox like the scheduler's.
    ``server_pid``: the Temporal server's process, whose CPU is read too."""
    log = workdir / f"floor-worker{'-sandboxed' if sandboxed else ''}.log"
    worker = start_floor_worker(temporal, log, sandboxed)
    profiling = Profiler(worker.pid, profile) if profile is not None else contextlib.nullcontext()
    try:
        cpu: dict[str, float] = {}
        wall: dict[str, float] = {}
        server: dict[str, float] = {}

        def server_cpu() -> float:
            return tree_cpu_seconds(server_pid) if server_pid is not None else 0.0

        async with Worker(client, task_queue=ACTIVITY_QUEUE, activities=[floor_noop]):
            handle = await start_floor(client)
            for _ in range(3):
                for _, update in FLOORS:
                    await handle.execute_update(update)  # warm up: cached, sticky
            with profiling:
                for name, update in FLOORS:
                    before, started = cpu_seconds(worker.pid), time.perf_counter()
                    server_before = server_cpu()
                    for _ in range(iterations):
                        await handle.execute_update(update)
                    wall[name] = (time.perf_counter() - started) * 1000 / iterations
                    cpu[name] = (cpu_seconds(worker.pid) - before) * 1000 / iterations
                    server[name] = (server_cpu() - server_before) * 1000 / iterations
            await handle.signal(FloorWorkflow.finish)
            await handle.result()
    finally:
        stop_process(worker)
    return FloorCpu(
        update_cpu_ms=cpu["update"],
        activity_cpu_ms=cpu["update+activity"],
        update_wall_ms=wall["update"],
        activity_wall_ms=wall["update+activity"],
        server_update_cpu_ms=server["update"],
        server_activity_cpu_ms=server["update+activity"],
    )
