"""Switch and hand-over time on two nodes against one, side by side in one run.

Two groups on one stack with two agents, one group's jobs on node-a only and
the other's on node-a and node-b, with the same simulated state per job and
node and the same bandwidth. Hand-overs alternate between the groups, so
both see the same load. The goal: two nodes cost at most 1.5x one, since the
nodes move their state in parallel.

    python -m bench multinode                 # 40 hand-overs each, 2 GiB per job and node
    python -m bench multinode --quick         # 10
    python -m bench multinode --state-gib 0   # the orchestration alone: zero-byte switches
"""

from __future__ import annotations

import argparse

import timeshare
from bench.handover import measure_handover
from bench.parts.stack import running_stack
from bench.parts.stats import p50_p90_p99
from timeshare.models import GroupPolicy
from timeshare.status import table

NODES = ["node-a", "node-b"]
# 2 x 107 ms of simulated transfer per node and switch (checkpoint, restore).
STATE_GIB = 2.0
BANDWIDTH_GBPS = 20.0


def main() -> None:
    parser = argparse.ArgumentParser(description="Switch time on two nodes against one.")
    parser.add_argument("--quick", action="store_true", help="10 hand-overs each instead of 40")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--state-gib", type=float, default=STATE_GIB, help="per job and node")
    parser.add_argument("--bandwidth-gbps", type=float, default=BANDWIDTH_GBPS)
    args = parser.parse_args()
    iterations = 10 if args.quick else args.iterations
    spans = {1: NODES[:1], 2: NODES}
    handover_ms: dict[int, list[float]] = {n: [] for n in spans}
    switch_ms: dict[int, list[float]] = {n: [] for n in spans}
    with running_stack(
        node=NODES[0], more_nodes=NODES[1:], state_gib=args.state_gib,
        bandwidth_gbps=args.bandwidth_gbps, sim_gpus=len(spans),
    ) as stack:  # fmt: skip
        print(f"stack ready; {iterations} hand-overs each", flush=True)
        with timeshare.connect(stack.address) as client:
            # Each group on a GPU of its own: a GPU is one group's at a time.
            pairs = {
                n: [
                    client.join(f"span-{n}", f"job-{x}", nodes, GroupPolicy(gpus=[n - 1]))
                    for x in "ab"
                ]
                for n, nodes in spans.items()
            }
            for _ in range(iterations):
                for n, (a, b) in pairs.items():
                    seconds: list[float] = []
                    handover_ms[n] += measure_handover(client, a, b, 1, seconds)
                    switch_ms[n] += [s * 1000 for s in seconds]
    rows = []
    for n, nodes in spans.items():
        handover, switch = p50_p90_p99(handover_ms[n]), p50_p90_p99(switch_ms[n])
        rows.append([str(n), ",".join(nodes), f"{switch[0]:.1f}", f"{switch[1]:.1f}",
                     f"{handover[0]:.1f}", f"{handover[1]:.1f}"])  # fmt: skip
    print()
    print(f"{args.state_gib:g} GiB per job and node at {args.bandwidth_gbps:g} GB/s (SIMULATED)")
    headers = ["nodes", "on", "switch p50 ms", "p90", "hand-over p50 ms", "p90"]
    print(table(headers, rows))
    s1, s2 = p50_p90_p99(switch_ms[1])[0], p50_p90_p99(switch_ms[2])[0]
    h1, h2 = p50_p90_p99(handover_ms[1])[0], p50_p90_p99(handover_ms[2])[0]
    print(
        f"switch_1node_p50_ms={s1:.1f} switch_2node_p50_ms={s2:.1f} switch_ratio={s2 / s1:.2f} "
        f"handover_1node_p50_ms={h1:.1f} handover_2node_p50_ms={h2:.1f} "
        f"handover_ratio={h2 / h1:.2f}"
    )


if __name__ == "__main__":
    main()
