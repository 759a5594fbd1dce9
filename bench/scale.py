"""Many groups on one stack: hand-over p99, CPU against Temporal's floor, idle cost, replicas.

Sim backend, one node, zero-byte switches. In one run, on one server: the
floor workflow's worker CPU (bench.parts.floors), the history idle jobs
write (bench.parts.idle_history), what turn watches cost
(bench.parts.watch_cost), the load (bench.parts.scale_load) at growing
sizes, then at 50 groups (or the first size) once more with the floor paced
the same way beside it in the same window (bench.parts.floors.PacedFloor).

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
import platform
from collections import Counter
from dataclasses import replace
from pathlib import Path

from temporalio.client import Client

from bench.parts.floor_layers import LAYERS, PAIR
from bench.parts.floors import FloorCpu, PacedFloor, PacedFloorCpu, measure_floor_cpu
from bench.parts.idle_history import IdleHistory, measure_idle_history
from bench.parts.procstat import load_average
from bench.parts.profiling import Profiler, read_profile
from bench.parts.scale_load import LoadResult, run_load
from bench.parts.stack import running_stack
from bench.parts.temporal_operations import TemporalOperations
from bench.parts.watch_cost import WatchCost, measure_watch_cost
from bench.parts.window_history import count_events, task_worker, window_events
from timeshare.models import MAX_GPUS_PER_NODE
from timeshare.status import table
from timeshare.testing import LocalStack
from timeshare.workers.common.service import connect_temporal

# The size whose scheduler CPU per hand-over makes worker_cpu_ratio.
REFERENCE_GROUPS = 50
P99_LIMIT_MS = 1000.0
SEARCH_STEP = 50
# Each group has a simulated GPU of its own, and a node has at most this many.
SEARCH_MAX = (MAX_GPUS_PER_NODE // SEARCH_STEP) * SEARCH_STEP
REPLICAS_GROUPS = 100


def stack_pids(stack: LocalStack) -> dict[str, int]:
    """The stack's processes and this one (every job's client runs here)."""
    return {**{name: p.pid for name, p in stack.processes.items()}, "bench": os.getpid()}


def print_loads(results: list[LoadResult], parts: list[str], schedulers: list[str]) -> None:
    headers = ["groups", "jobs", "hand-overs", "hand-overs/s", "p50 ms", "p99 ms",
               "leases lost", "scheduler CPU ms/hand-over",
               *(f"{part} cores" for part in parts)]  # fmt: skip
    rows = [
        [str(r.groups), str(r.jobs), str(r.handovers), f"{r.handovers_per_s:.1f}",
         f"{r.p50_ms:.0f}", f"{r.p99_ms:.0f}", str(r.evictions + len(r.lost)),
         f"{r.cpu_ms_per_handover(schedulers):.1f}", *(f"{r.cpu_share(p):.2f}" for p in parts)]
        for r in results
    ]  # fmt: skip
    print(table(headers, rows))


def print_idle(idle: IdleHistory) -> None:
    lease = f"{idle.idle_lease_seconds:g} s"
    rows = [
        [f"before: heartbeat every 10 s (idle lease {lease})", str(idle.before.jobs),
         str(idle.before.total), str(idle.before.renewals), f"{idle.before.per_job_hour():.1f}"],
        [f"now, idle lease {lease} (renewal every {idle.idle_lease_seconds / 3:g} s), measured",
         str(idle.now.jobs), str(idle.now.total), str(idle.now.renewals),
         f"{idle.now.per_job_hour():.1f}"],
        [f"now, scaled to the default idle lease ({idle.scale:.4f} of the above)",
         "", "", "", f"{idle.now_per_job_hour:.2f}"],
        ["now, default policy, measured", str(idle.default_policy.jobs),
         str(idle.default_policy.total), str(idle.default_policy.renewals),
         f"{idle.default_policy.per_job_hour():.1f}"],
    ]  # fmt: skip
    print("\n" + table(["idle jobs", "jobs", "events", "renewals", "events per job-hour"], rows))
    for name, window in (("before", idle.before), ("now", idle.now)):
        kinds = ", ".join(f"{kind} {n}" for kind, n in window.events.most_common())
        print(f"events in the '{name}' window: {kinds}")


def print_watch(watch: WatchCost) -> None:
    parts = [name for name in watch.watched if name != "bench"]
    windows = {"each holder's turn watched": watch.watched, "no turn held": watch.unwatched,
               "a backfill holder's turn watched": watch.backfill}  # fmt: skip
    rows = [[f"{watch.groups} groups, {w}", *(f"{cores[p]:.3f}" for p in parts)]
            for w, cores in windows.items()]  # fmt: skip
    print("\n" + table(["no hand-overs: cores busy", *parts], rows))


def print_floor(floor: FloorCpu, sandboxed: FloorCpu, paced: PacedFloorCpu | None,
                handovers: PacedFloorCpu | None) -> None:  # fmt: skip
    rows = [
        [what, f"{floor.cpu_ms[name]:.2f}", f"{floor.wall_ms[name]:.1f}",
         f"{sandboxed.cpu_ms[name]:.2f}"]
        for what, name in (("trivial update", "update"),
                           ("update awaiting one remote activity", "update+activity"))
    ]  # fmt: skip
    if paced is not None:
        how = ", activations inline" if paced.inline else ""
        how += ", publishing as a hand-over does" if paced.publishes else ""
        rows.append([f"the two, paced: {paced.workflows} workflows, a pair each every "
                     f"{paced.period:g} s ({paced.pairs} pairs{how})",
                     f"{paced.cpu_ms_per_pair:.2f}", "-", "-"])  # fmt: skip
    if handovers is not None:
        rows.append([f"hand-over layer '{handovers.layer}', paced: {handovers.workflows} "
                     f"workflows, a hand-over each every {handovers.period:g} s ({handovers.pairs} "
                     "hand-overs, in the same window)",
                     f"{handovers.cpu_ms_per_pair:.2f}", "-", "-"])  # fmt: skip
    headers = ["floor (workflow worker in its own process)", "CPU ms", "wall ms",
               "CPU ms in the scheduler's sandbox"]  # fmt: skip
    print("\n" + table(headers, rows))


def print_profiles(directory: Path, cpu_ms: dict[str, float]) -> None:
    """What each profiled process spent its Python time on; ``cpu_ms``: its
    CPU per hand-over (or per floor pair), which the shares are of."""
    profiles = {name: read_profile(directory / f"{name}.txt") for name in cpu_ms}
    names = list(profiles)
    modules = Counter[str]()
    for profile in profiles.values():
        modules.update({m: n / max(1, profile.samples) for m, n in profile.modules.items()})
    rows = [
        [module, *(f"{profiles[n].modules[module] / max(1, profiles[n].samples) * 100:.0f} %"
                   for n in names)]
        for module, _ in modules.most_common(16)
    ]  # fmt: skip
    print("\n" + table(["module in the stack (GIL samples)", *names], rows))
    for name in names:
        profile = profiles[name]
        print(f"\n{name}: {profile.samples} samples ({profile.seconds:.1f} s holding the GIL); "
              f"{cpu_ms[name]:.2f} ms CPU per unit")  # fmt: skip
        rows = [[f"{share * 100:.1f} %", fn] for fn, share in profile.top(profile.own, 12)]
        print(table(["own", "function"], rows))
        rows = [[f"{share * 100:.1f} %", fn] for fn, share in profile.top(profile.total, 30)]
        print(table(["in stack", "function"], rows))


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
    idle = await measure_idle_history(
        temporal, stack.address, stack.node, args.idle_groups, 3, args.idle_seconds,
        args.idle_lease,
    )  # fmt: skip
    print(f"idle history: {idle.before.per_job_hour():.0f} events/job-hour before, "
          f"{idle.now_per_job_hour:.2f} now (load {load_average()})", flush=True)  # fmt: skip
    watch = await measure_watch_cost(
        stack.address, stack.node, stack_pids(stack), args.watch_groups, args.watch_seconds
    )
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
    history = await window_events(temporal, reference)
    side_by_side, paced, handovers = (
        await load_beside_floor(args, stack, temporal, reference, workdir)
        if args.period > 0
        else (None, None, None)
    )
    report(
        args, stack, (floor, sandboxed, paced, handovers), idle, watch, results, operations,
        history, side_by_side,
    )  # fmt: skip


async def load_beside_floor(
    args: argparse.Namespace,
    stack: LocalStack,
    temporal: Client,
    reference: LoadResult,
    workdir: Path,
) -> tuple[LoadResult, PacedFloorCpu, PacedFloorCpu | None]:
    """The reference load again, with the floor workflow paced the same way
    beside it in the same window: worker_cpu_ratio compares the two. With
    ``--floor-handovers`` a hand-over floor (a layer of bench.parts.floor_layers,
    ``shape`` unless named) runs in that window too, paced as the groups are."""
    layers = [replace(PAIR, publishes=args.floor_publishes)]
    layers += [LAYERS[args.floor_handovers]] if args.floor_handovers else []
    async with contextlib.AsyncExitStack() as floors:
        paced = [
            await floors.enter_async_context(PacedFloor(
                temporal, stack.temporal, reference.groups, args.period, workdir, args.seed + n,
                inline=args.floor_inline, layer=layer,
            ))
            for n, layer in enumerate(layers)
        ]  # fmt: skip
        load = await run_load(
            stack.addresses, stack_pids(stack), reference.groups, args.jobs_per_group,
            stack.node, args.period, args.seconds, args.seed, name="beside",
            during=[floor.window(args.seconds) for floor in paced],
        )  # fmt: skip
    floor, beside = paced[0], paced[1].result if len(paced) > 1 else None
    assert floor.result is not None
    print(f"beside the paced floor: scheduler "
          f"{load.cpu_ms_per_handover(stack.scheduler_parts):.2f} ms CPU per hand-over, floor "
          f"{floor.result.cpu_ms_per_pair:.2f} ms per pair over {floor.result.pairs} pairs "
          f"(load {load_average()})", flush=True)  # fmt: skip
    if beside is not None:
        print(f"  and the hand-over floor ({beside.layer}): {beside.cpu_ms_per_pair:.2f} ms per "
              f"hand-over over {beside.pairs}", flush=True)  # fmt: skip
    return load, floor.result, beside


def reference_result(results: list[LoadResult]) -> LoadResult:
    """The load at REFERENCE_GROUPS, or the first size run."""
    return next((r for r in results if r.groups == REFERENCE_GROUPS), results[0])


def print_history(history: Counter[str], result: LoadResult) -> None:
    print(f"\nhistory per hand-over at {result.groups} groups, in the window (the floor: "
          "3 workflow tasks, 2 updates, 1 activity):")  # fmt: skip
    rows = [[kind, f"{n / max(1, result.handovers):.2f}"] for kind, n in history.most_common(14)]
    print(table(["event", "per hand-over"], rows))


def print_operations(operations: TemporalOperations, result: LoadResult) -> None:
    print(f"\nTemporal's requests per hand-over at {result.groups} groups "
          "(a call counts in each service it passes through):")  # fmt: skip
    if operations.error:
        print(f"  not read: {operations.error}")
        return
    print(table(["counter", "service", "operation", "per hand-over"],
                operations.rows(result.handovers)))  # fmt: skip


def report(
    args: argparse.Namespace,
    stack: LocalStack,
    floors: tuple[FloorCpu, FloorCpu, PacedFloorCpu | None, PacedFloorCpu | None],
    idle: IdleHistory,
    watch: WatchCost,
    results: list[LoadResult],
    operations: dict[int, TemporalOperations],
    history: Counter[str],
    side_by_side: LoadResult | None,
) -> None:
    floor, sandboxed, paced, handovers = floors
    print_floor(floor, sandboxed, paced, handovers)
    print_watch(watch)
    print_idle(idle)
    pace = (
        f"one hand-over per group every {args.period:g} s" if args.period else "as fast as possible"
    )
    replicas = f"{len(stack.scheduler_parts)} scheduler(s), {len(stack.gateway_parts)} gateway(s)"
    print(f"\nload: {args.jobs_per_group} jobs per group, {pace}, {args.seconds:g} s per size; "
          f"{replicas}")  # fmt: skip
    parts = [*stack.scheduler_parts, *stack.gateway_parts, "temporal", "agent", "bench"]
    print_loads(results, parts, stack.scheduler_parts)
    reference = reference_result(results)
    at_reference = operations[reference.groups]
    print_operations(at_reference, reference)
    print_history(history, reference)
    if args.profile is not None:
        units = {
            "floor-worker": floor.per_handover_floor_ms,
            "floor-worker-sandboxed": sandboxed.per_handover_floor_ms,
        }
        for part in (*stack.scheduler_parts, *stack.gateway_parts):
            units[part] = reference.cpu_ms_per_handover([part])
        print_profiles(args.profile, units)
    worker_ms = reference.cpu_ms_per_handover(stack.scheduler_parts)
    back_to_back = worker_ms / floor.per_handover_floor_ms
    # The ratio's two sides, from one window where the load was paced.
    measured, floor_ms = (
        (side_by_side, paced.cpu_ms_per_pair)
        if side_by_side is not None and paced is not None
        else (reference, floor.per_handover_floor_ms)
    )
    beside_ms = measured.cpu_ms_per_handover(stack.scheduler_parts)
    ratio = beside_ms / floor_ms
    with_edges = measured.cpu_ms_per_handover_with_edges(stack.scheduler_parts) / floor_ms
    temporal_ms = reference.cpu_ms_per_handover(["temporal"])
    temporal_ratio = temporal_ms / max(1e-9, floor.per_handover_server_floor_ms)
    print(f"Temporal's CPU per hand-over at {reference.groups} groups: {temporal_ms:.1f} ms, "
          f"against {floor.per_handover_server_floor_ms:.1f} ms for the floor's two updates "
          f"(ratio {temporal_ratio:.2f})")  # fmt: skip
    if reference.edge_cpu:
        print(f"scheduler CPU per hand-over at {reference.groups} groups: "
              f"{worker_ms:.1f} ms in the window; "
              f"{reference.cpu_ms_per_handover_with_edges(stack.scheduler_parts):.1f} ms counting "
              "each group's first grant and last yield too "
              f"(ratio {with_edges:.2f})")  # fmt: skip
    layer_figures = ""
    if handovers is not None and paced is not None:
        layer_figures = (
            f"handover_floor_layer={handovers.layer} "
            f"handover_floor_cpu_ms={handovers.cpu_ms_per_pair:.2f} "
            f"handover_floor_ratio={handovers.cpu_ms_per_pair / paced.cpu_ms_per_pair:.2f} "
            f"worker_cpu_ratio_vs_handover_floor={beside_ms / handovers.cpu_ms_per_pair:.2f} "
        )
    handover_count = max(1, reference.handovers)
    under = [r.groups for r in results if r.p99_ms < P99_LIMIT_MS and not (r.evictions or r.lost)]
    last = results[-1]
    print(f"machine: {platform.node()} {platform.platform()}; load average at the end "
          f"{load_average()}")  # fmt: skip
    print(
        f"groups={last.groups} handovers_per_s={last.handovers_per_s:.1f} p99_ms={last.p99_ms:.0f} "
        f"max_groups_p99_under_1s={max(under, default=0)} "
        f"lost_leases={sum(r.evictions + len(r.lost) for r in results)} "
        f"worker_cpu_ms_per_handover={worker_ms:.2f} "
        f"floor_cpu_ms={floor_ms:.2f} worker_cpu_ratio={ratio:.2f} "
        f"worker_cpu_ms_per_handover_beside_floor={beside_ms:.2f} "
        f"back_to_back_floor_cpu_ms={floor.per_handover_floor_ms:.2f} "
        f"worker_cpu_ratio_back_to_back={back_to_back:.2f} {layer_figures}"
        f"worker_cpu_ratio_with_edges={with_edges:.2f} "
        f"temporal_cpu_ms_per_handover={temporal_ms:.2f} temporal_cpu_ratio={temporal_ratio:.2f} "
        f"workflow_tasks_per_handover={history['WORKFLOW_TASK_COMPLETED'] / handover_count:.2f} "
        f"sandboxed_floor_cpu_ms={sandboxed.per_handover_floor_ms:.2f} "
        f"history_events_per_idle_job_hour={idle.now_per_job_hour:.2f} "
        f"history_events_per_idle_job_hour_before={idle.before.per_job_hour():.0f} "
        f"watch_temporal_cores_per_100_groups={watch.watched['temporal'] * 100 / watch.groups:.2f}"
        f" backfill_watch_temporal_cores_per_100_groups="
        f"{watch.backfill['temporal'] * 100 / watch.groups:.2f}"
        f" temporal_requests_per_handover="
        f"{at_reference.total('service_requests', 'frontend') / handover_count:.2f}"
        f" temporal_store_requests_per_handover="
        f"{at_reference.total('persistence_requests') / handover_count:.2f}"
    )


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
