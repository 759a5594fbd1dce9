"""Measuring the floors (bench.parts.floor_layers) on a server: each layer's
workflow worker in a process of its own (``python -m bench floors worker``),
as the scheduler runs, its CPU read from /proc.

time_pair sends the pair's two updates back to back to one workflow:
time_floors from workers in the benchmark's process, FloorBeside from
workers on a thread of their own between a synchronous benchmark's blocks,
measure_floor_cpu reading the workflow worker's CPU per update. PacedFloor
paces a layer's workflows as bench.scale's paced load paces its groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowHandle
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.parts.floor_layers import (
    FLOORS,
    JOBS,
    PAIR,
    FloorWorkflow,
    Held,
    Layer,
    activity_queue,
    floor_noop,
    start_floor,
)
from bench.parts.handover_segments import Event, history_events
from bench.parts.procstat import cpu_seconds, tree_cpu_seconds
from bench.parts.profiling import Profiler
from timeshare.workers.common.children import spawn, stop_process
from timeshare.workflows.visibility import HOLDER

READY_SECONDS = 60.0
READY_LINE = "floor worker: ready"
T = TypeVar("T")


@dataclass
class PairTimes:
    """The pair's updates, each sent ``iterations`` times in a row to one workflow."""

    wall_ms: dict[str, list[float]]  # each round trip
    # Milliseconds of each counter (CPU seconds read by the caller) per update.
    counted_ms: dict[str, list[float]]
    events: list[Event]  # the workflow's history


async def time_pair(
    client: Client, queue: str, iterations: int, counters: Callable[[], list[float]] = list
) -> PairTimes:
    """Send each of the pair's updates to a new floor workflow on ``queue``
    (warmed up first: cached, sticky)."""
    handle = await start_floor(client, queue)
    for _ in range(3):
        for _, update in FLOORS:
            await handle.execute_update(update)
    wall: dict[str, list[float]] = {name: [] for name, _ in FLOORS}
    counted = {}
    for name, update in FLOORS:
        before = counters()
        for _ in range(iterations):
            start = time.perf_counter()
            await handle.execute_update(update)
            wall[name].append((time.perf_counter() - start) * 1000)
        counted[name] = [
            (c - b) * 1000 / iterations for c, b in zip(counters(), before, strict=True)
        ]
    await handle.signal(FloorWorkflow.finish)
    await handle.result()
    return PairTimes(wall, counted, await history_events(handle))


@contextlib.asynccontextmanager
async def floor_workers(client: Client) -> AsyncIterator[str]:
    """The pair's workers in this process, on a task queue of their own (its name)."""
    queue = f"{PAIR.task_queue}-{uuid.uuid4().hex[:6]}"
    async with (
        Worker(client, task_queue=queue, workflows=[FloorWorkflow],
               workflow_runner=UnsandboxedWorkflowRunner()),
        Worker(client, task_queue=activity_queue(queue), activities=[floor_noop]),
    ):  # fmt: skip
        yield queue


async def time_floors(client: Client, iterations: int) -> PairTimes:
    """The pair from workers in this process."""
    async with floor_workers(client) as queue:
        return await time_pair(client, queue, iterations)


@dataclass
class FloorCpu:
    """The pair's updates sent back to back: milliseconds of the floor
    workflow worker's CPU and of the Temporal server's (where its process was
    named) per update, and the mean round trip, each by update name."""

    cpu_ms: dict[str, float]
    server_cpu_ms: dict[str, float]
    wall_ms: dict[str, float]

    @property
    def per_handover_floor_ms(self) -> float:
        # A hand-over is at least an update that returns at once (the yield)
        # and one that awaits a switch activity (the waiter's acquire).
        return sum(self.cpu_ms.values())

    @property
    def per_handover_server_floor_ms(self) -> float:
        return sum(self.server_cpu_ms.values())


@dataclass
class PacedFloorCpu:
    """A layer's worker CPU per hand-over (per pair for the pair floor) under
    a paced load."""

    workflows: int
    period: float
    pairs: int
    cpu_ms_per_pair: float
    # Activations on the worker's event loop (as the scheduler's), not on the
    # SDK's default thread pool.
    inline: bool = False
    # Each hand-over also upserted what a turn watch reads.
    publishes: bool = False
    layer: str = ""
    # The Temporal server's CPU per pair in the window (0: not read).
    server_cpu_ms_per_pair: float = 0.0


class PacedFloor:
    """A layer's worker (in a process of its own) serving ``workflows``
    workflows, each handing over (or sent the pair) every ``period`` seconds
    at a random phase, to the next of its three jobs in turn: the cost under
    the paced load's shape (as many workflows in its cache, as many
    wake-ups). Entered, it has started the worker and the workflows;
    ``window()`` paces them and measures, beside whatever else runs in that
    window (bench.scale runs its load there: both then share the machine's
    moment, which on a shared VM moves CPU per unit of work by more than the
    difference measured)."""

    def __init__(
        self, client: Client, temporal: str, workflows: int, period: float, workdir: Path,
        seed: int = 1, inline: bool = False, layer: Layer = PAIR, server_pid: int | None = None,
    ) -> None:  # fmt: skip
        """``inline``: the worker runs activations on its event loop, as the
        scheduler does, instead of the SDK's default thread pool.
        ``server_pid``: the Temporal server's, whose CPU each window reads too."""
        self._client, self._temporal, self._server_pid = client, temporal, server_pid
        self.inline, self.layer = inline, layer
        self._workflows, self._period = workflows, period
        self._log = workdir / f"floor-worker-paced-{layer.name}.log"
        self._rng = random.Random(seed)
        self._stack = contextlib.AsyncExitStack()
        self._worker: subprocess.Popen[bytes] | None = None
        self._handles: list[WorkflowHandle[Any, Any]] = []
        # The turn each workflow's job holds, and the index of the job asking next.
        self._turns: list[tuple[Held, int]] = []
        self._sent: list[int] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.result: PacedFloorCpu | None = None

    async def __aenter__(self) -> PacedFloor:
        layer = self.layer
        settings = "scheduler" if layer.kind == "group" else "sdk"
        self._worker = start_floor_worker(
            self._temporal, self._log, inline=self.inline, task_queue=layer.task_queue,
            settings=settings,
        )  # fmt: skip
        self._stack.callback(stop_process, self._worker)
        concurrency = max(100, self._workflows)
        await self._stack.enter_async_context(layer.activity_worker(self._client, concurrency))
        starts = (layer.start(self._client) for _ in range(self._workflows))
        self._handles = list(await asyncio.gather(*starts))
        self._turns = list(await asyncio.gather(*map(self._first_turns, self._handles)))
        return self

    async def _first_turns(self, handle: WorkflowHandle[Any, Any]) -> tuple[Held, int]:
        """Warm up: the first grant, then one hand-over, before the window."""
        now = time.monotonic()
        held = await self.layer.hand_over(handle, None, JOBS[0], now, now)
        held = await self.layer.hand_over(handle, held, JOBS[1], now, now)
        return held, 2

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            if exc[0] is None and self.layer.publishes:
                await self._check_published()
        finally:
            # Each workflow ends before its worker stops: one left open would
            # have its next task replayed from the whole history by the next
            # floor's worker, inside that floor's window.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    asyncio.gather(*(self.layer.finish(h) for h in self._handles)),
                    READY_SECONDS,
                )
            await self._stack.aclose()

    async def _check_published(self) -> None:
        """A floor that was to publish and did not would be compared unfairly."""
        description = await self._handles[0].describe()
        if description.typed_search_attributes.get(HOLDER) is None:
            raise RuntimeError("the paced floor was to publish, but its workflow shows no holder")

    async def _pace(self, index: int, phase: float, until: float) -> None:
        """One workflow's hand-overs, as bench.parts.scale_load.paced_group
        times a group's: the waiter asks half a period before each moment,
        the holder yields on the moment."""
        handle, period = self._handles[index], self._period
        moment = phase + period
        while moment <= until:
            held, asking = self._turns[index]
            held = await self.layer.hand_over(
                handle, held, JOBS[asking], moment - period / 2, moment
            )
            self._turns[index] = (held, (asking + 1) % len(JOBS))
            self._sent[index] += 1
            moment += period

    async def settle(self) -> None:
        """Until the last window's hand-overs end: the next window's must
        not overlap them on one workflow."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @contextlib.contextmanager
    def window(self, seconds: float) -> Iterator[None]:
        """Pace every workflow for ``seconds`` from entering; on leaving, the
        worker's CPU per hand-over completed so far is ``result``."""
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
        server = self._server_pid
        before = cpu_seconds(self._worker.pid)
        server_before = tree_cpu_seconds(server) if server is not None else 0.0
        try:
            yield
        finally:
            used = cpu_seconds(self._worker.pid) - before
            server_used = tree_cpu_seconds(server) - server_before if server is not None else 0.0
            pairs = max(1, sum(self._sent))
            self.result = PacedFloorCpu(
                self._workflows, self._period, sum(self._sent), used * 1000 / pairs,
                self.inline, self.layer.publishes, self.layer.name, server_used * 1000 / pairs,
            )  # fmt: skip


def start_floor_worker(
    temporal: str, log_path: Path, sandboxed: bool = False, inline: bool = False,
    task_queue: str = PAIR.task_queue, settings: str = "sdk",
) -> subprocess.Popen[bytes]:  # fmt: skip
    """``settings``: ``sdk`` for the floors, ``scheduler`` for a worker that
    stands for the scheduler (``python -m bench floors worker --help``)."""
    command = [
        sys.executable, "-m", "bench", "floors", "worker", f"--temporal={temporal}",
        f"--task-queue={task_queue}", f"--settings={settings}",
        *(["--sandboxed"] if sandboxed else []), *(["--inline"] if inline else []),
    ]  # fmt: skip
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
    ``profile``: py-spy the worker over the updates, to this file.
    ``sandboxed``: the workflow runs in a sandbox like the scheduler's.
    ``server_pid``: the Temporal server's process, whose CPU is read too."""
    log = workdir / f"floor-worker{'-sandboxed' if sandboxed else ''}.log"
    worker = start_floor_worker(temporal, log, sandboxed)
    profiling = Profiler(worker.pid, profile) if profile is not None else contextlib.nullcontext()

    def counters() -> list[float]:
        server = tree_cpu_seconds(server_pid) if server_pid is not None else 0.0
        return [cpu_seconds(worker.pid), server]

    try:
        async with PAIR.activity_worker(client, 100):
            with profiling:
                times = await time_pair(client, PAIR.task_queue, iterations, counters)
    finally:
        stop_process(worker)
    return FloorCpu(
        {name: counted[0] for name, counted in times.counted_ms.items()},
        {name: counted[1] for name, counted in times.counted_ms.items()},
        {name: statistics.mean(wall) for name, wall in times.wall_ms.items()},
    )


class FloorBeside:
    """The pair's workers on an event loop of their own thread, so that a
    synchronous benchmark can time the floor in blocks between its own
    (``time``), each block beside the load of the moment."""

    def __init__(self, address: str, connect: Callable[[str], Awaitable[Client]]) -> None:
        """``connect(address)``: a Temporal client."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        self._client, self._queue = self._submit(self._enter(address, connect))

    def _submit(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    async def _enter(
        self, address: str, connect: Callable[[str], Awaitable[Client]]
    ) -> tuple[Client, str]:
        client = await connect(address)
        return client, await self._stack.enter_async_context(floor_workers(client))

    def time(self, iterations: int) -> PairTimes:
        return self._submit(time_pair(self._client, self._queue, iterations))

    def close(self) -> None:
        self._submit(self._stack.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
