"""What `bench scale` prints: its tables, and the last line of figures
(docs/benchmarks.md, "Scale", says what each means)."""

from __future__ import annotations

import argparse
import platform
from collections import Counter
from pathlib import Path

from bench.parts.floors import FloorCpu, PacedFloorCpu
from bench.parts.idle_history import IdleHistory
from bench.parts.procstat import load_average
from bench.parts.profiling import read_profile
from bench.parts.scale_load import LoadResult
from bench.parts.stats import percentile
from bench.parts.store_costs import HandoverStore, StoreCosts, explained
from bench.parts.temporal_operations import TemporalOperations
from bench.parts.watch_cost import WatchCost
from bench.parts.window_history import WindowCounts
from timeshare.status import table
from timeshare.testing import LocalStack

# The size whose scheduler CPU per hand-over makes worker_cpu_ratio.
REFERENCE_GROUPS = 50
P99_LIMIT_MS = 1000.0
# The frontend requests that read a group's state from outside (a turn watch's
# describe, a status query), counted per hand-over beside the history's kinds.
DESCRIBE_OPERATIONS = ("DescribeWorkflowExecution", "QueryWorkflow", "PollWorkflowExecutionUpdate")


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
               "a backfill holder's turn watched": watch.backfill,
               "each holder's turn watched, a turn limit (pushed)": watch.asking}  # fmt: skip
    rows = [[f"{watch.groups} groups, {w}", *(f"{cores[p]:.3f}" for p in parts)]
            for w, cores in windows.items()]  # fmt: skip
    print("\n" + table(["no hand-overs: cores busy", *parts], rows))
    heard = watch.should_yield_ms
    print(f"should_yield heard, from the start of the workflow task that asked ({len(heard)} "
          f"backfill holders): p50 {percentile(heard, 50):.1f} ms, p99 "
          f"{percentile(heard, 99):.1f} ms")  # fmt: skip


def watch_figures(watch: WatchCost) -> str:
    per_100 = 100 / watch.groups
    return (
        f"watch_temporal_cores_per_100_groups={watch.watched['temporal'] * per_100:.2f} "
        f"watch_gateway_cores_per_100_groups={watch.watched['gateway'] * per_100:.2f} "
        f"backfill_watch_temporal_cores_per_100_groups={watch.backfill['temporal'] * per_100:.2f} "
        f"backfill_watch_gateway_cores_per_100_groups={watch.backfill['gateway'] * per_100:.2f} "
        f"asking_watch_temporal_cores_per_100_groups={watch.asking['temporal'] * per_100:.2f} "
        f"asking_watch_gateway_cores_per_100_groups={watch.asking['gateway'] * per_100:.2f} "
        f"should_yield_p50_ms={percentile(watch.should_yield_ms, 50):.1f} "
        f"should_yield_p99_ms={percentile(watch.should_yield_ms, 99):.1f}"
    )


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


def reference_result(results: list[LoadResult]) -> LoadResult:
    """The load at REFERENCE_GROUPS, or the first size run."""
    return next((r for r in results if r.groups == REFERENCE_GROUPS), results[0])


def print_history(
    history: WindowCounts, operations: TemporalOperations, result: LoadResult
) -> None:
    per = max(1, result.handovers)
    print(f"\nhistory per hand-over at {result.groups} groups, in the window (the floor: "
          "3 workflow tasks, 2 updates, 1 activity):")  # fmt: skip
    rows = [[kind, f"{n / per:.2f}"] for kind, n in history.events.most_common()]
    print(table(["event", "per hand-over"], rows))
    rows = [["workflow task", cause, f"{n / per:.2f}"] for cause, n in history.causes.most_common()]
    rows += [["visibility write", kind, f"{n / per:.2f}"]
             for kind, n in history.visibility.most_common()]  # fmt: skip
    rows += [["request", op, f"{operations.count('service_requests', 'frontend', op) / per:.2f}"]
             for op in DESCRIBE_OPERATIONS]  # fmt: skip
    rows += [["visibility store", op, f"{n / per:.2f}"]
             for (metric, _, op), n in operations.counts.most_common()
             if metric == "visibility_persistence_requests"]  # fmt: skip
    print(f"\nby kind, per hand-over at {result.groups} groups (docs/benchmarks.md says which "
          "a hand-over needs):")  # fmt: skip
    print(table(["kind", "what", "per hand-over"], rows))


def print_store(
    store: StoreCosts, history: WindowCounts, operations: TemporalOperations, result: LoadResult
) -> None:
    if store.error or operations.error:
        print(f"\nstore requests by block: not read: {store.error or operations.error}")
        return
    per = max(1, result.handovers)
    handover = HandoverStore(
        total=operations.total("persistence_requests") / per,
        describes=operations.count("service_requests", "frontend", DESCRIBE_OPERATIONS[0]) / per,
        search_attribute_upserts=history.visibility["search attributes"] / per,
    )
    costs = ", ".join(f"{name} {n:.2f}" for name, n in store.per_call.items())
    print(f"\nstore requests per hand-over at {result.groups} groups, by block (each block's "
          f"cost measured on this server before the load, per call: {costs}):")  # fmt: skip
    print(table(["block", "per hand-over", "store requests", "needed?"],
                explained(store, handover)))  # fmt: skip


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
    floors: tuple[
        FloorCpu, FloorCpu, PacedFloorCpu | None, PacedFloorCpu | None, PacedFloorCpu | None
    ],
    idle: IdleHistory,
    watch: WatchCost,
    results: list[LoadResult],
    operations: dict[int, TemporalOperations],
    history: WindowCounts,
    side_by_side: LoadResult | None,
    store: StoreCosts,
) -> None:
    floor, sandboxed, paced, handovers, alone = floors
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
    print_history(history, at_reference, reference)
    print_store(store, history, at_reference, reference)
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
    temporal_back_to_back = temporal_ms / max(1e-9, floor.per_handover_server_floor_ms)
    # Like with like where it was measured: the floor paced as the load, alone.
    temporal_floor_ms = (
        alone.server_cpu_ms_per_pair
        if alone is not None and alone.server_cpu_ms_per_pair > 0
        else floor.per_handover_server_floor_ms
    )
    temporal_ratio = temporal_ms / max(1e-9, temporal_floor_ms)
    print(f"Temporal's CPU per hand-over at {reference.groups} groups: {temporal_ms:.1f} ms, "
          f"against {temporal_floor_ms:.1f} ms per pair of the floor paced alone as the load "
          f"(ratio {temporal_ratio:.2f}) and {floor.per_handover_server_floor_ms:.1f} ms for "
          f"its two updates back to back (ratio {temporal_back_to_back:.2f})")  # fmt: skip
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
    tasks = history.events["WORKFLOW_TASK_COMPLETED"]
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
        f"temporal_cpu_ms_per_handover={temporal_ms:.2f} "
        f"temporal_floor_cpu_ms={temporal_floor_ms:.2f} "
        f"temporal_cpu_ratio={temporal_ratio:.2f} "
        f"temporal_cpu_ratio_back_to_back={temporal_back_to_back:.2f} "
        f"workflow_tasks_per_handover={tasks / handover_count:.2f} "
        f"sandboxed_floor_cpu_ms={sandboxed.per_handover_floor_ms:.2f} "
        f"history_events_per_idle_job_hour={idle.now_per_job_hour:.2f} "
        f"history_events_per_idle_job_hour_before={idle.before.per_job_hour():.0f} "
        f"{watch_figures(watch)}"
        f" temporal_requests_per_handover="
        f"{at_reference.total('service_requests', 'frontend') / handover_count:.2f}"
        f" temporal_store_requests_per_handover="
        f"{at_reference.total('persistence_requests') / handover_count:.2f}"
        f" temporal_store_requests_floor={store.pair if not store.error else 0:.2f}"
        f" visibility_store_requests_per_handover="
        f"{at_reference.total('visibility_persistence_requests') / handover_count:.2f}"
    )
