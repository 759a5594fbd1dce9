"""Many groups on one stack: hand-over p99, CPU against Temporal's floor, idle cost, replicas.

Sim backend, one node, zero-byte switches. In one run, on one server: the
floor workflow's worker CPU (bench.parts.floors), the history idle jobs
write (bench.parts.idle_history), what turn watches cost
(bench.parts.watch_cost), the load (bench.parts.scale_load) at growing
sizes, then at 50 groups (or the first size) once more with the floor paced
the same way beside it in the same window (bench.parts.floors.PacedFloor),
then that floor alone for as long: the Temporal server's CPU per pair, which
temporal_cpu_ratio sets a hand-over's against.

``--compare-replicas``: only the paced load (the first of ``--sizes``, or
100 groups), on one scheduler and gateway, then on two of each: the cores
each process kept busy, and the share of the workflow tasks each scheduler
completed (by the worker identity Temporal records).

worker_cpu_ratio sets the scheduler against the floor from that one window:
on this shared VM the CPU a unit of work costs moves by ±20 % from minute to
minute, more than what is compared. Its other forms, the options and every
figure: docs/benchmarks.md, "Scale".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
from dataclasses import replace
from pathlib import Path

from temporalio.client import Client

from bench.parts.floor_layers import LAYERS, PAIR
from bench.parts.floors import PacedFloor, PacedFloorCpu, measure_floor_cpu
from bench.parts.idle_history import measure_idle_history
from bench.parts.procstat import load_average
from bench.parts.profiling import Profiler
from bench.parts.scale_load import LoadResult, run_load
from bench.parts.scale_report import P99_LIMIT_MS, REFERENCE_GROUPS, reference_result, report
from bench.parts.stack import running_stack
from bench.parts.store_costs import CALLS as STORE_CALLS
from bench.parts.store_costs import measure_store_costs
from bench.parts.temporal_operations import TemporalOperations
from bench.parts.watch_cost import measure_watch_cost
from bench.parts.window_history import count_events, task_worker, window_counts
from timeshare.models import MAX_GPUS_PER_NODE
from timeshare.status import table
from timeshare.testing import LocalStack
from timeshare.workers.common.service import connect_temporal

SEARCH_STEP = 50
# Each group has a simulated GPU of its own, and a node has at most this many.
SEARCH_MAX = (MAX_GPUS_PER_NODE // SEARCH_STEP) * SEARCH_STEP
REPLICAS_GROUPS = 100


def stack_pids(stack: LocalStack) -> dict[str, int]:
    """The stack's processes and this one (every job's client runs here)."""
    return {**{name: p.pid for name, p in stack.processes.items()}, "bench": os.getpid()}


async def run(args: argparse.Namespace, stack: LocalStack, workdir: Path) -> None:
    temporal = await connect_temporal(stack.temporal, "default")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    floor, sandboxed = [
        await measure_floor_cpu(
            temporal, stack.temporal, args.floor_iterations, workdir,
            args.profile / f"floor-worker{suffix}.txt" if args.profile else None,
            sandboxed=bool(suffix), server_pid=stack.processes["temporal"].pid,
        )
        for suffix in ("", "-sandboxed")
    ]  # fmt: skip
    cpu, server = floor.cpu_ms, floor.server_cpu_ms
    print(f"floor: update {cpu['update']:.2f} ms CPU, update+activity "
          f"{cpu['update+activity']:.2f} ms CPU; Temporal's {server['update']:.2f} and "
          f"{server['update+activity']:.2f} ms", flush=True)  # fmt: skip
    store = await measure_store_costs(
        temporal, stack.temporal_metrics_port, min(STORE_CALLS, args.floor_iterations)
    )
    idle = await measure_idle_history(
        temporal, stack.address, stack.node, args.idle_groups, 3, args.idle_seconds,
        args.idle_lease,
    )  # fmt: skip
    print(f"idle history: {idle.before.per_job_hour():.0f} events/job-hour before, "
          f"{idle.now_per_job_hour:.2f} now (load {load_average()})", flush=True)  # fmt: skip
    watch = await measure_watch_cost(
        temporal, stack.address, stack.node, stack_pids(stack), args.watch_groups,
        args.watch_seconds,
    )  # fmt: skip
    watched = watch.watched
    print(f"watches of {watch.groups} held turns: Temporal {watched['temporal']:.2f} cores, "
          f"gateway {watched['gateway']:.2f} (load {load_average()})", flush=True)  # fmt: skip
    results: list[LoadResult] = []
    operations: dict[int, TemporalOperations] = {}
    for groups in args.sizes or itertools.count(SEARCH_STEP, SEARCH_STEP):
        profiling = contextlib.ExitStack()
        if args.profile is not None and groups == REFERENCE_GROUPS:
            for part in (*stack.scheduler_parts, *stack.gateway_parts):
                pid = stack.processes[part].pid
                profiling.enter_context(Profiler(pid, args.profile / f"{part}.txt"))
        operations[groups] = TemporalOperations(stack.temporal_metrics_port)
        result = await run_load(
            stack.addresses, stack_pids(stack), groups, args.jobs_per_group, stack.node,
            args.period, args.seconds, args.seed,
            during=[profiling, operations[groups].window()],
        )  # fmt: skip
        results.append(result)
        print(f"{groups} groups: {result.handovers_per_s:.1f} hand-overs/s, p99 "
              f"{result.p99_ms:.0f} ms, leases lost {result.evictions + len(result.lost)} "
              f"(load {load_average()})", flush=True)  # fmt: skip
        for lost in result.lost:
            print(f"  lost: {lost}")
        if not args.sizes and (
            result.p99_ms >= P99_LIMIT_MS or result.evictions or result.lost or groups >= SEARCH_MAX
        ):
            break
    reference = reference_result(results)
    history = await window_counts(temporal, reference)
    side_by_side, paced, handovers, alone = (
        await load_beside_floor(args, stack, temporal, reference, workdir)
        if args.period > 0
        else (None, None, None, None)
    )
    report(
        args, stack, (floor, sandboxed, paced, handovers, alone), idle, watch, results, operations,
        history, side_by_side, store,
    )  # fmt: skip


async def load_beside_floor(
    args: argparse.Namespace,
    stack: LocalStack,
    temporal: Client,
    reference: LoadResult,
    workdir: Path,
) -> tuple[LoadResult, PacedFloorCpu, PacedFloorCpu | None, PacedFloorCpu]:
    """The reference load again, with the floor workflow paced the same way
    beside it in the same window: worker_cpu_ratio compares the two. With
    ``--floor-handovers`` a hand-over floor (a layer of bench.parts.floor_layers,
    ``shape`` unless named) runs in that window too, paced as the groups are.
    Then the floor alone for as long, paced the same way: what it costs the
    Temporal server, which one window cannot split between load and floor
    (the last PacedFloorCpu returned)."""
    layers = [replace(PAIR, publishes=args.floor_publishes)]
    layers += [LAYERS[args.floor_handovers]] if args.floor_handovers else []
    async with contextlib.AsyncExitStack() as floors:
        paced = [
            await floors.enter_async_context(PacedFloor(
                temporal, stack.temporal, reference.groups, args.period, workdir, args.seed + n,
                inline=args.floor_inline, layer=layer,
                server_pid=stack.processes["temporal"].pid if n == 0 else None,
            ))
            for n, layer in enumerate(layers)
        ]  # fmt: skip
        load = await run_load(
            stack.addresses, stack_pids(stack), reference.groups, args.jobs_per_group,
            stack.node, args.period, args.seconds, args.seed, name="beside",
            during=[floor.window(args.seconds) for floor in paced],
        )  # fmt: skip
        floor, beside = paced[0], paced[1].result if len(paced) > 1 else None
        with_load = floor.result
        assert with_load is not None
        for each in paced:
            await each.settle()
        with floor.window(args.seconds):
            await asyncio.sleep(args.seconds)
        alone = floor.result
        assert alone is not None
    print(f"beside the paced floor: scheduler "
          f"{load.cpu_ms_per_handover(stack.scheduler_parts):.2f} ms CPU per hand-over, floor "
          f"{with_load.cpu_ms_per_pair:.2f} ms per pair over {with_load.pairs} pairs "
          f"(load {load_average()})", flush=True)  # fmt: skip
    if beside is not None:
        print(f"  and the hand-over floor ({beside.layer}): {beside.cpu_ms_per_pair:.2f} ms per "
              f"hand-over over {beside.pairs}", flush=True)  # fmt: skip
    print(f"the floor paced alone: Temporal {alone.server_cpu_ms_per_pair:.2f} ms CPU per pair "
          f"over {alone.pairs} pairs (load {load_average()})", flush=True)  # fmt: skip
    return load, with_load, beside, alone


async def replicas_load(
    stack: LocalStack, groups: int, args: argparse.Namespace
) -> tuple[LoadResult, dict[str, float]]:
    """The paced load, and the share of its workflow tasks each scheduler completed."""
    pids = stack_pids(stack)
    result = await run_load(
        stack.addresses, pids, groups, args.jobs_per_group, stack.node, args.period,
        args.seconds, args.seed, name=f"replicas{stack.schedulers}",
    )  # fmt: skip
    client = await connect_temporal(stack.temporal, "default")
    tasks = await count_events(client, result.group_names, task_worker)
    # The SDK's default identity is "<pid>@<host>".
    by_part = {
        part: sum(n for who, n in tasks.items() if who.startswith(f"{pids[part]}@"))
        for part in stack.scheduler_parts
    }
    return result, {part: n / max(1, sum(tasks.values())) for part, n in by_part.items()}


def compare_replicas(args: argparse.Namespace) -> None:
    groups = args.sizes[0] if args.sizes else REPLICAS_GROUPS
    rows = []
    for replicas in (1, 2):
        with running_stack(
            state_gib=0.0, schedulers=replicas, gateways=replicas, sim_gpus=groups
        ) as stack:
            result, shares = asyncio.run(replicas_load(stack, groups, args))
        print(f"{replicas} replica(s): {result.handovers_per_s:.1f} hand-overs/s, p99 "
              f"{result.p99_ms:.0f} ms (load {load_average()})", flush=True)  # fmt: skip
        parts = (*stack.scheduler_parts, *stack.gateway_parts, "temporal", "agent")
        rows.append([
            str(replicas), str(result.handovers), f"{result.handovers_per_s:.1f}",
            f"{result.p99_ms:.0f}", str(result.evictions + len(result.lost)),
            ", ".join(f"{part} {result.cpu_share(part):.2f}" for part in parts),
            ", ".join(f"{part} {share * 100:.0f} %" for part, share in shares.items()),
        ])  # fmt: skip
    pace = (
        f"a hand-over per group every {args.period:g} s" if args.period else "as fast as possible"
    )
    print(f"\n{groups} groups of {args.jobs_per_group} jobs, {pace}, {args.seconds:g} s")
    print(table(["replicas", "hand-overs", "hand-overs/s", "p99 ms", "leases lost",
                 "cores busy", "workflow tasks completed"], rows))  # fmt: skip
    one, two = rows
    ratio = float(two[2]) / max(0.1, float(one[2]))
    print(f"handovers_per_s_1={one[2]} handovers_per_s_2={two[2]} p99_ms_1={one[3]} "
          f"p99_ms_2={two[3]} rate_ratio={ratio:.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description="Hand-overs and their cost as groups grow.")
    parser.add_argument("--quick", action="store_true", help="10 and 50 groups, shorter windows")
    parser.add_argument("--period", type=float, default=5.0, help="seconds between a group's "
                        "hand-overs (0: as fast as possible; default %(default)s)")  # fmt: skip
    parser.add_argument("--replicas", type=int, default=1, help="schedulers and gateways each")
    parser.add_argument("--compare-replicas", action="store_true",
                        help="only the load: one scheduler and gateway, then two")  # fmt: skip
    parser.add_argument("--sizes", type=lambda s: [int(n) for n in s.split(",")],
                        help="group counts, comma-separated (default: search upward)")  # fmt: skip
    parser.add_argument("--seconds", type=float, help="per size (default 30, quick 20)")
    parser.add_argument("--jobs-per-group", type=int, default=3)
    parser.add_argument("--idle-groups", type=int, default=10, help="groups of 3 idle jobs")
    parser.add_argument("--idle-seconds", type=float, help="idle window (default 60, quick 30)")
    parser.add_argument("--idle-lease", type=float, default=30.0, help="the idle jobs' idle lease, "
                        "scaled to the default's (default %(default)s s)")  # fmt: skip
    parser.add_argument("--floor-iterations", type=int, help="default 200, quick 50")
    parser.add_argument("--watch-seconds", type=float, help="watch window (default 10, quick 5)")
    parser.add_argument("--watch-groups", type=int, default=REFERENCE_GROUPS, help="groups "
                        "whose held turns are watched (default %(default)s)")  # fmt: skip
    parser.add_argument("--floor-inline", action="store_true", help="the paced floor's worker "
                        "runs activations on its event loop, as the scheduler does (default: the "
                        "SDK's thread pool, its default)")  # fmt: skip
    parser.add_argument("--floor-publishes", action="store_true", help="the paced floor's updates "
                        "also upsert the search attributes a hand-over changes (the waiter's queue "
                        "depth; the new holder), as the turn watch needs")  # fmt: skip
    parser.add_argument(
        "--floor-handovers", nargs="?", const="shape", choices=list(LAYERS), metavar="LAYER",
        help="also pace a hand-over floor in the same window: the layer of "
        "bench.parts.floor_layers named (default shape: a hand-over's shape with nothing else, "
        "what any scheduler of this protocol pays; group: GroupWorkflow driven directly)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", type=Path, help="py-spy the schedulers and gateways here")
    args = parser.parse_args()
    if args.quick and args.sizes is None:
        args.sizes = [10, REFERENCE_GROUPS]
    args.seconds = args.seconds or (20.0 if args.quick else 30.0)
    args.idle_seconds = args.idle_seconds or (30.0 if args.quick else 60.0)
    args.floor_iterations = args.floor_iterations or (50 if args.quick else 200)
    args.watch_seconds = args.watch_seconds or (5.0 if args.quick else 10.0)
    if args.compare_replicas:
        compare_replicas(args)
        return
    with running_stack(
        state_gib=0.0, schedulers=args.replicas, gateways=args.replicas,
        sim_gpus=MAX_GPUS_PER_NODE,
    ) as stack:  # fmt: skip
        print(f"stack ready (load {load_average()})", flush=True)
        asyncio.run(run(args, stack, stack.workdir))


if __name__ == "__main__":
    main()
