"""The same paced load on one scheduler and gateway, then on two of each.

Against one Temporal, in one run. For each: hand-overs per second, the p99
hand-over, the cores each process kept busy, and the share of the groups'
workflow tasks each scheduler replica completed (by the worker identity
Temporal records on every completed workflow task).

    python -m bench replicas                 # 100 groups of 3, one hand-over per group every 5 s
    python -m bench replicas --groups 50 --period 0     # as fast as possible
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from functools import partial

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.parts.procstat import load_average
from bench.parts.scale_load import LoadResult, bounded, run_load
from bench.parts.stack import running_stack
from timeshare.names import group_workflow_id
from timeshare.status import table
from timeshare.testing import LocalStack
from timeshare.workers.common.service import connect_temporal


async def task_identities(client: Client, groups: list[str]) -> Counter[str]:
    """Workflow tasks completed in the groups' histories, by worker identity."""

    async def one(group: str) -> Counter[str]:
        history = await client.get_workflow_handle(group_workflow_id(group)).fetch_history()
        return Counter(
            event.workflow_task_completed_event_attributes.identity
            for event in history.events
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        )

    total: Counter[str] = Counter()
    for counted in await bounded([partial(one, group) for group in groups]):
        total.update(counted)
    return total


async def measure(
    stack: LocalStack, args: argparse.Namespace
) -> tuple[LoadResult, dict[str, float]]:
    pids = {name: process.pid for name, process in stack.processes.items()}
    result = await run_load(
        stack.addresses, pids, args.groups, 3, stack.node, args.period, args.seconds,
        name=f"replicas{stack.schedulers}",
    )  # fmt: skip
    client = await connect_temporal(stack.temporal, "default")
    names = [f"replicas{stack.schedulers}-{args.groups}-{g}" for g in range(args.groups)]
    tasks = await task_identities(client, names)
    # The SDK's default identity is "<pid>@<host>".
    by_part = {
        part: float(sum(n for who, n in tasks.items() if who.startswith(f"{pids[part]}@")))
        for part in stack.scheduler_parts
    }
    return result, {part: n / max(1.0, sum(tasks.values())) for part, n in by_part.items()}


def run(replicas: int, args: argparse.Namespace) -> list[str]:
    with running_stack(
        state_gib=0.0, schedulers=replicas, gateways=replicas, sim_gpus=args.groups
    ) as stack:
        result, shares = asyncio.run(measure(stack, args))
    print(
        f"{replicas} replica(s): {result.handovers_per_s:.1f} hand-overs/s, p99 "
        f"{result.p99_ms:.0f} ms (load {load_average()})",
        flush=True,
    )
    cores = ", ".join(
        f"{part} {result.cpu_share(part):.2f}"
        for part in (*stack.scheduler_parts, *stack.gateway_parts, "temporal", "agent")
    )
    split = ", ".join(f"{part} {share * 100:.0f} %" for part, share in shares.items())
    return [
        str(replicas), str(result.handovers), f"{result.handovers_per_s:.1f}",
        f"{result.p99_ms:.0f}", str(result.evictions + len(result.lost)), cores, split,
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description="One scheduler and gateway against two of each.")
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--period", type=float, default=5.0, help="0: as fast as possible")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    rows = [run(replicas, args) for replicas in (1, 2)]
    pace = (
        f"a hand-over per group every {args.period:g} s" if args.period else "as fast as possible"
    )
    print(f"\n{args.groups} groups of 3 jobs, {pace}, {args.seconds:g} s")
    headers = ["replicas", "hand-overs", "hand-overs/s", "p99 ms", "leases lost",
               "cores busy", "workflow tasks completed"]  # fmt: skip
    print(table(headers, rows))
    one, two = rows
    print(
        f"handovers_per_s_1={one[2]} handovers_per_s_2={two[2]} "
        f"p99_ms_1={one[3]} p99_ms_2={two[3]} "
        f"rate_ratio={float(two[2]) / max(0.1, float(one[2])):.2f}"
    )


if __name__ == "__main__":
    main()
