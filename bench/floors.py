"""Temporal's own floors: hop by hop in fresh processes, and a hand-over's worker CPU by layer.

    python -m bench floors hops            # 4 runs of 30 updates
    python -m bench floors layers          # 25 workflows each, 3 rounds of 30 s
    python -m bench floors layers --quick  # one round of 20 s

``hops``: the pair's update awaiting one activity, and from its history the
two dispatches inside it; each run a new process with its own workers and
connection, so the spread between runs is the server's and the SDK's.

``layers``: what a hand-over costs the workflow worker, layer by layer
(bench.parts.floor_layers), each layer's worker in a process of its own,
side by side in one window, paced as bench.scale paces its groups; the
figures: docs/benchmarks.md, "a hand-over, layer by layer".

``worker`` (not listed), which the others start: a layer's workflow worker,
optionally in the scheduler's sandbox, with activations inline, on the
scheduler's settings (``--settings scheduler``) rather than the SDK's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from bench.parts.floor_layers import LAYERS, PAIR, WORKFLOWS
from bench.parts.floors import READY_LINE, PacedFloor, PacedFloorCpu, time_floors
from bench.parts.handover_segments import Event
from bench.parts.procstat import load_average
from timeshare.models import GroupPolicy
from timeshare.status import table
from timeshare.testing import temporal_only
from timeshare.workers.common.children import die_with_parent_if_asked
from timeshare.workers.common.service import connect_temporal
from timeshare.workers.common.temporal_settings import TemporalSettings
from timeshare.workers.scheduler.data_converter import DATA_CONVERTER
from timeshare.workers.scheduler.serve import (
    external_storage_concurrency,
    sdk_external_storage_concurrency,
)

RESULT_PREFIX = "floor hops:"
# The group layer's jobs hold their turns with the default policy's lease.
MAX_PERIOD = GroupPolicy().lease_seconds / 2


async def one_run(address: str, iterations: int) -> tuple[float, float, float]:
    """(update+activity p50, activity dispatch p50, dispatch back p50), ms."""
    times = await time_floors(await connect_temporal(address, "default"), iterations)
    dispatch = hops(times.events, "ACTIVITY_TASK_SCHEDULED", "ACTIVITY_TASK_STARTED")
    back = hops(times.events, "ACTIVITY_TASK_COMPLETED", "WORKFLOW_TASK_STARTED")
    total = statistics.median(times.wall_ms["update+activity"])
    return total, statistics.median(dispatch), statistics.median(back)


def hops(events: list[Event], start: str, end: str) -> list[float]:
    """Milliseconds from each ``start`` event to the first ``end`` after it."""
    found = []
    for index, event in enumerate(events):
        if event.kind == start:
            after = next((e.at for e in events[index + 1 :] if e.kind == end), None)
            if after is not None:
                found.append((after - event.at) * 1000)
    return found


def measure_hops(args: argparse.Namespace) -> None:
    if args.one:
        total, dispatch, back = asyncio.run(one_run(args.one, args.iterations))
        print(f"{RESULT_PREFIX} {total:.1f} {dispatch:.1f} {back:.1f}", flush=True)
        return
    rows = []
    with temporal_only() as stack:
        for run in range(args.runs):
            one = subprocess.run(
                [sys.executable, "-m", "bench", "floors", "hops", f"--one={stack.temporal}",
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


async def one_round(
    temporal: str, workdir: Path, args: argparse.Namespace, seed: int
) -> dict[str, PacedFloorCpu]:
    """The pair floor and every layer, paced in one window."""
    client = await connect_temporal(temporal, "default")
    async with contextlib.AsyncExitStack() as stack:
        floors = {}
        for offset, layer in enumerate([PAIR, *LAYERS.values()]):
            inline = layer is not PAIR or not args.floor_defaults
            floors[layer.name] = PacedFloor(
                client, temporal, args.workflows, args.period, workdir, seed + offset, inline,
                layer,
            )  # fmt: skip
            await stack.enter_async_context(floors[layer.name])
            print(f"  {layer.name}: {args.workflows} workflows started and warmed up", flush=True)
        with contextlib.ExitStack() as windows:
            for floor in floors.values():
                windows.enter_context(floor.window(args.seconds))
            await asyncio.sleep(args.seconds)
    return {name: floor.result for name, floor in floors.items() if floor.result is not None}


def ratios(results: dict[str, PacedFloorCpu]) -> dict[str, float]:
    floor = results[PAIR.name].cpu_ms_per_pair
    return {name: r.cpu_ms_per_pair / floor for name, r in results.items() if name != PAIR.name}


def report(rounds: list[dict[str, PacedFloorCpu]]) -> None:
    names = list(rounds[0])
    headers = ["round", *(f"{name} ms (ratio)" for name in names), "hand-overs each"]
    rows = []
    for index, results in enumerate(rounds, start=1):
        against = ratios(results)
        cells = [
            f"{results[name].cpu_ms_per_pair:.2f}"
            + (f" ({against[name]:.2f})" if name in against else "")
            for name in names
        ]
        counts = "/".join(str(results[name].pairs) for name in names)
        rows.append([str(index), *cells, counts])
    print(table(headers, rows))
    medians = {name: statistics.median(ratios(results)[name] for results in rounds)
               for name in LAYERS}  # fmt: skip
    floor_ms = statistics.median(results[PAIR.name].cpu_ms_per_pair for results in rounds)
    over_shape = statistics.median(
        results["group"].cpu_ms_per_pair / results["shape"].cpu_ms_per_pair for results in rounds
    )
    print(f"machine: {platform.node()} {platform.platform()}; load average {load_average()}")
    print(
        f"rounds={len(rounds)} pair_floor_inline={int(rounds[0][PAIR.name].inline)} "
        f"pair_floor_cpu_ms={floor_ms:.2f} "
        + " ".join(f"{name}_ratio={value:.2f}" for name, value in medians.items())
        + f" group_over_shape={over_shape:.2f}"
    )


async def rounds(args: argparse.Namespace, temporal: str, workdir: Path) -> None:
    results = []
    for index in range(args.rounds):
        print(f"round {index + 1} of {args.rounds}: {args.seconds:g} s (load {load_average()})",
              flush=True)  # fmt: skip
        logs = workdir / f"round-{index + 1}"  # each round's workers write logs of their own
        logs.mkdir()
        results.append(await one_round(temporal, logs, args, args.seed + 10 * index))
    report(results)


def measure_layers(args: argparse.Namespace) -> None:
    args.seconds = args.seconds or (20.0 if args.quick else 30.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    with temporal_only() as stack:
        print(f"Temporal ready (load {load_average()})", flush=True)
        asyncio.run(rounds(args, stack.temporal, stack.workdir))


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    as_scheduler = args.settings == "scheduler"
    converter = DATA_CONVERTER if as_scheduler else pydantic_data_converter
    # The scheduler's compression, or the SDK's default.
    settings = TemporalSettings(
        address=args.temporal, compression="none" if as_scheduler else "gzip"
    )
    client = await connect_temporal(settings, data_converter=converter)
    storage = (
        external_storage_concurrency(converter)
        if as_scheduler
        else sdk_external_storage_concurrency()
    )
    # The scheduler's sandbox (timeshare.workflows.sandbox: every timeshare
    # module passed through, as here the benchmark's), or none.
    restrictions = SandboxRestrictions.default.with_passthrough_modules("timeshare", "bench")
    runner = (
        SandboxedWorkflowRunner(restrictions=restrictions)
        if args.sandboxed
        else UnsandboxedWorkflowRunner()
    )
    async with Worker(
        client, task_queue=args.task_queue, workflows=WORKFLOWS, workflow_runner=runner,
        debug_mode=args.inline, max_workflow_task_external_storage_concurrency=storage,
    ):  # fmt: skip
        print(READY_LINE, flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="Temporal's own floors.")
    what = parser.add_subparsers(dest="what", required=True, metavar="{hops,layers}")
    hops_options = what.add_parser("hops", help="the pair's update awaiting an activity, by hop")
    hops_options.add_argument("--runs", type=int, default=4)
    hops_options.add_argument("--iterations", type=int, default=30)
    hops_options.add_argument("--one", metavar="ADDRESS", help=argparse.SUPPRESS)
    layers = what.add_parser("layers", help="a hand-over's worker CPU, layer by layer")
    layers.add_argument("--quick", action="store_true", help="one round of 20 s")
    layers.add_argument("--workflows", type=int, default=25, help="per layer (default 25)")
    layers.add_argument("--period", type=float, default=5.0, help="seconds between hand-overs")
    layers.add_argument("--seconds", type=float, help="per round (default 30, quick 20)")
    layers.add_argument("--rounds", type=int, help="default 3, quick 1")
    layers.add_argument("--floor-defaults", action="store_true", help="the pair floor's worker "
                        "on the SDK's defaults (activations on its thread pool), as "
                        "worker_cpu_ratio's floor is; default: inline, as the layers and the "
                        "scheduler")  # fmt: skip
    layers.add_argument("--seed", type=int, default=1)
    worker = what.add_parser("worker")  # started by the others; not listed
    worker.add_argument("--temporal", required=True, help="the Temporal frontend, HOST:PORT")
    worker.add_argument("--sandboxed", action="store_true", help="in the scheduler's sandbox")
    worker.add_argument("--inline", action="store_true", help="activations on the event loop")
    worker.add_argument("--task-queue", default=PAIR.task_queue)
    worker.add_argument("--settings", choices=("sdk", "scheduler"), default="sdk")
    args = parser.parse_args()
    if args.what == "hops":
        measure_hops(args)
    elif args.what == "layers":
        if args.workflows < 1 or not 0 < args.period <= MAX_PERIOD:
            # A holder yields a period after its grant: past its lease, it would be evicted.
            parser.error(f"--workflows must be at least 1, --period over 0 and at most "
                         f"{MAX_PERIOD:g}")  # fmt: skip
        measure_layers(args)
    else:
        die_with_parent_if_asked()
        if args.sandboxed and args.inline:
            parser.error("--inline runs outside the sandbox, as the scheduler does")
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
