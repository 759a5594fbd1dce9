"""Temporal's own floors on the same server, for comparison with timeshare's
hand-over: a trivial update round trip, and an update whose handler awaits one
activity on another task queue (what a one-node switch costs at least).

measure_floors times them from a worker in the benchmark's process;
measure_floor_cpu runs the workflow's worker in a process of its own
(bench.parts.floor_worker), as the scheduler runs, and reads its CPU per update,
the updates sent back to back to one workflow; PacedFloor sends
them as bench.scale's paced load sends its messages (many workflows, one pair
each per period), so that the two are compared under the same load; with
``publishes``, each pair also upserts the search attributes a hand-over
changes, which the turn watch reads (timeshare.workers.gateway.turn_watch). Given a
``layer`` of bench.parts.handover_floors, PacedFloor paces hand-overs of that
layer's workflows instead of pairs.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.parts.handover_floors import JOBS, Held, Layer, floor_noop
from bench.parts.procstat import cpu_seconds, tree_cpu_seconds
from bench.parts.profiling import Profiler
from timeshare.workers.common.children import spawn, stop_process
from timeshare.workflows.visibility import HOLDER, QUEUE_DEPTH

WORKFLOW_QUEUE = "bench.floor"
ACTIVITY_QUEUE = "bench.floor.activity"
READY_SECONDS = 60.0
READY_LINE = "floor worker: ready"


@workflow.defn(name="FloorWorkflow")
class FloorWorkflow:
    @workflow.init
    def __init__(self, publishes: bool = False) -> None:
        """``publishes``: each update also upserts the search attributes a
        hand-over's message changes (workflows/visibility.py), so that the
        floor carries what the turn watch needs of every hand-over."""
        self._done = False
        self._publishes = publishes
        self._grants = 0

    @workflow.run
    async def run(self, publishes: bool = False) -> None:
        await workflow.wait_condition(lambda: self._done)

    @workflow.update
    def ping(self) -> None:
        if self._publishes:  # as a waiter's acquire: one more job waits
            workflow.upsert_search_attributes([QUEUE_DEPTH.value_set(1)])

    @workflow.update
    async def via_activity(self) -> None:
        await workflow.execute_activity(
            "floor_noop", task_queue=ACTIVITY_QUEUE, start_to_close_timeout=timedelta(seconds=30)
        )
        if self._publishes:  # as the grant after a switch: a new holder, nobody waits
            self._grants += 1
            holder = HOLDER.value_set(f"job-{self._grants % 3}")
            workflow.upsert_search_attributes([holder, QUEUE_DEPTH.value_set(0)])

    @workflow.signal
    def finish(self) -> None:
        self._done = True


FLOORS = (("update", FloorWorkflow.ping), ("update+activity", FloorWorkflow.via_activity))


async def start_floor(
    client: Client, task_queue: str = WORKFLOW_QUEUE, publishes: bool = False
) -> WorkflowHandle[FloorWorkflow, None]:
    return await client.start_workflow(
        FloorWorkflow.run, publishes, id=f"floor-{uuid.uuid4().hex[:8]}", task_queue=task_queue
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
    def per_handover_floor_ms(self) -> float:
        # A hand-over is at least an update that returns at once (the yield)
        # and one that awaits a switch activity (the waiter's acquire).
        return self.update_cpu_ms + self.activity_cpu_ms

    @property
    def per_handover_server_floor_ms(self) -> float:
        return self.server_update_cpu_ms + self.server_activity_cpu_ms


@dataclass
class PacedFloorCpu:
    """The floor worker's CPU per pair of updates (or per hand-over of a
    hand-over-shaped layer) under a paced load."""

    workflows: int
    period: float
    pairs: int
    cpu_ms_per_pair: float
    # Activations on the worker's event loop (as the scheduler's), not on the
    # SDK's default thread pool.
    inline: bool = False
    # Each pair also upserted what a hand-over publishes (FloorWorkflow).
    publishes: bool = False
    # The hand-over-shaped layer paced instead of the pair (bench.parts.handover_floors).
    layer: str = ""


class PacedFloor:
    """The floor workflow's worker (in a process of its own) serving
    ``workflows`` workflows, each sent a pair of updates every ``period``
    seconds at a random phase: the SDK's own cost under the paced load's
    shape (as many workflows in its cache, as many wake-ups). Entered, it
    has started the worker and the workflows; ``window()`` paces them and
    measures, beside whatever else runs in that window (bench.scale runs its
    load there: both then share the machine's moment, which on a shared VM
    moves CPU per unit of work by more than the difference measured)."""

    def __init__(
        self, client: Client, temporal: str, workflows: int, period: float, workdir: Path,
        seed: int = 1, inline: bool = False, publishes: bool = False, layer: Layer | None = None,
    ) -> None:  # fmt: skip
        """``inline``: the worker runs activations on its event loop, as the
        scheduler does, instead of the SDK's default thread pool.
        ``publishes``: each pair upserts what a hand-over publishes.
        ``layer``: each workflow hands over (bench.parts.handover_floors), paced as
        a group of bench.parts.scale_load, instead of being sent a pair."""
        if publishes and layer is not None:
            raise ValueError("publishes is the pair floor's; a layer says what it publishes")
        self._client, self._temporal = client, temporal
        self.inline, self.publishes, self.layer = inline, publishes, layer
        self._workflows, self._period = workflows, period
        self._log = workdir / f"floor-worker-paced{f'-{layer.name}' if layer else ''}.log"
        self._rng = random.Random(seed)
        self._stack = contextlib.AsyncExitStack()
        self._worker: subprocess.Popen[bytes] | None = None
        self._handles: list[WorkflowHandle[Any, Any]] = []
        # A layer's workflows: the turn each holds, and the index of the job asking next.
        self._turns: list[tuple[Held, int]] = []
        self._sent: list[int] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.result: PacedFloorCpu | None = None

    async def __aenter__(self) -> PacedFloor:
        layer, concurrency = self.layer, max(100, self._workflows)
        queue = layer.task_queue if layer else WORKFLOW_QUEUE
        settings = "scheduler" if layer and layer.group else "sdk"
        self._worker = start_floor_worker(self._temporal, self._log, inline=self.inline,
                                          task_queue=queue, settings=settings)  # fmt: skip
        self._stack.callback(stop_process, self._worker)
        activities = (
            layer.activity_worker(self._client, concurrency)
            if layer
            else Worker(
                self._client, task_queue=ACTIVITY_QUEUE, activities=[floor_noop],
                max_concurrent_activities=concurrency,
            )
        )  # fmt: skip
        await self._stack.enter_async_context(activities)
        if layer is not None:
            self._handles = list(
                await asyncio.gather(*(layer.start(self._client) for _ in range(self._workflows)))
            )
            self._turns = list(await asyncio.gather(*map(self._first_turns, self._handles)))
            return self
        starts = (
            start_floor(self._client, publishes=self.publishes) for _ in range(self._workflows)
        )
        self._handles = list(await asyncio.gather(*starts))
        for handle in self._handles:  # warm up: each workflow cached before the window
            for _, update in FLOORS:
                await handle.execute_update(update)
        return self

    async def _first_turns(self, handle: WorkflowHandle[Any, Any]) -> tuple[Held, int]:
        """Warm up: the first grant, then one hand-over, before the window."""
        assert self.layer is not None
        now = time.monotonic()
        held = await self.layer.hand_over(handle, None, JOBS[0], now, now)
        held = await self.layer.hand_over(handle, held, JOBS[1], now, now)
        return held, 2

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            if exc[0] is None and (self.publishes or (self.layer and self.layer.publishes)):
                await self._check_published()
        finally:
            # Each workflow ends before its worker stops: one left open would
            # have its next task replayed from the whole history by the next
            # floor's worker, inside that floor's window.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    asyncio.gather(*(self._finish(h) for h in self._handles)), READY_SECONDS
                )
            await self._stack.aclose()

    async def _finish(self, handle: WorkflowHandle[Any, Any]) -> None:
        if self.layer is not None:
            await self.layer.finish(handle)
            return
        await handle.signal(FloorWorkflow.finish)
        await handle.result()

    async def _check_published(self) -> None:
        """A floor that was to publish and did not would be compared unfairly."""
        description = await self._handles[0].describe()
        if description.typed_search_attributes.get(HOLDER) is None:
            raise RuntimeError("the paced floor was to publish, but its workflow shows no holder")

    async def _pace(self, index: int, phase: float, until: float) -> None:
        """One workflow's pairs, as bench.parts.scale_load.paced_group times a
        group's hand-overs: the trivial update half a period before each
        moment (as a waiter's acquire arrives), the update awaiting the
        activity on the moment (as the yield starts the switch, whose end
        completes the acquire). A layer's workflow hands over at the same
        moments, to the next of its three jobs in turn."""
        handle, period = self._handles[index], self._period
        moment = phase + period
        while moment <= until:
            if self.layer is not None:
                held, asking = self._turns[index]
                held = await self.layer.hand_over(
                    handle, held, JOBS[asking], moment - period / 2, moment
                )
                self._turns[index] = (held, (asking + 1) % len(JOBS))
            else:
                await asyncio.sleep(max(0.0, moment - period / 2 - time.monotonic()))
                await handle.execute_update(FloorWorkflow.ping)
                await asyncio.sleep(max(0.0, moment - time.monotonic()))
                await handle.execute_update(FloorWorkflow.via_activity)
            self._sent[index] += 1
            moment += period

    @contextlib.contextmanager
    def window(self, seconds: float) -> Iterator[None]:
        """Pace every workflow for ``seconds`` from entering; on leaving, the
        worker's CPU per pair completed so far is ``result``."""
        assert self._worker is not None, "enter the PacedFloor first"
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        self._sent = [0] * len(self._handles)
        self._tasks = [
            loop.create_task(
                self._pace(i, started + self._rng.uniform(0, self._period), started + seconds)
            )
            for i in range(len(self._handles))
        ]
        before = cpu_seconds(self._worker.pid)
        try:
            yield
        finally:
            used = cpu_seconds(self._worker.pid) - before
            pairs = sum(self._sent)
            self.result = PacedFloorCpu(
                self._workflows,
                self._period,
                pairs,
                used * 1000 / max(1, pairs),
                self.inline,
                self.publishes,
                self.layer.name if self.layer else "",
            )


def start_floor_worker(
    temporal: str, log_path: Path, sandboxed: bool = False, inline: bool = False,
    task_queue: str = WORKFLOW_QUEUE, settings: str = "sdk",
) -> subprocess.Popen[bytes]:  # fmt: skip
    """``settings``: ``sdk`` for the floors, ``scheduler`` for a worker that
    stands for the scheduler (bench.parts.floor_worker)."""
    command = [
        sys.executable, "-m", "bench.parts.floor_worker", f"--temporal={temporal}",
        f"--task-queue={task_queue}", f"--settings={settings}",
    ]  # fmt: skip
    if sandboxed:
        command.append("--sandboxed")
    if inline:
        command.append("--inline")
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
