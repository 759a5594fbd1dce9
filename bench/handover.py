"""Hand-over latency on one node beside Temporal's floors, hop by hop; on two nodes; the sim's own.

Re-acquire with nobody waiting, and A's yield to waiting B's acquire
returning (zero-byte switches, sim backend); hops: bench.parts.handover_segments.

    python -m bench handover           # 200 iterations each
    python -m bench handover --quick   # 40
    python -m bench handover --sim-switch /dev/shm   # the sim backend's own switch, alone
    python -m bench handover --two-nodes              # two nodes against one, 40 each
    python -m bench handover --two-nodes --state-gib 0   # the orchestration alone

What each figure means: docs/benchmarks.md, "Hand-over latency" and
"Switches on two nodes".
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path

import timeshare
from bench.parts.floors import FloorBeside
from bench.parts.handover_segments import (
    FLOOR_SEGMENTS,
    SEGMENTS,
    Event,
    all_segments,
    floor_segments,
    history_events,
)
from bench.parts.stack import running_stack
from bench.parts.stats import p50_p90_p99, percentile
from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.sim import SimBackend
from timeshare.models import GroupPolicy
from timeshare.names import group_workflow_id
from timeshare.status import table
from timeshare.workers.common.service import connect_temporal
from timeshare.workers.temporal.dev_server import (
    TRANSFER_QUEUE_READS_PER_SECOND,
    TRANSFER_READS_SETTING,
)

GROUP = "handover"
# A pause between the sim's switches, as a hand-over leaves between its switches.
SIM_PAUSE_SECONDS = 0.003
NODES = ["node-a", "node-b"]
# --two-nodes: 2 x 107 ms of simulated transfer per node and switch (checkpoint, restore).
STATE_GIB = 2.0
BANDWIDTH_GBPS = 20.0
# Re-acquires, hand-overs and the floor's pairs in turn, this many blocks of
# each: every ratio's two sides meet the same load on a shared machine.
BLOCKS = 4


def measure_reacquire(job: timeshare.Job, iterations: int) -> list[float]:
    timings = []
    job.acquire()
    job.yield_()
    for _ in range(iterations):
        start = time.perf_counter()
        job.acquire()
        timings.append((time.perf_counter() - start) * 1000)
        job.yield_()
    return timings


def wait_until_queued(client: timeshare.Client, job: timeshare.Job) -> None:
    for _ in range(2000):
        if job.name in client.get_group(job.group).queue:
            return
        time.sleep(0.002)
    raise RuntimeError(f"{job.name} never queued")


def acquire_and_note_time(
    job: timeshare.Job, granted: list[tuple[float, float, timeshare.Turn]]
) -> None:
    turn = job.acquire()
    granted.append((time.perf_counter(), time.time(), turn))


def measure_handover(
    client: timeshare.Client,
    a: timeshare.Job,
    b: timeshare.Job,
    iterations: int,
    switches: list[float] | None = None,
    wall_clock: list[tuple[float, float]] | None = None,
) -> list[float]:
    """Milliseconds from A's yield to waiting B's acquire returning; the
    scheduler's own switch seconds of each hand-over go to ``switches``, and
    the wall-clock times of the yield call and the grant to ``wall_clock``."""
    timings = []
    for _ in range(iterations):
        a.acquire()
        granted: list[tuple[float, float, timeshare.Turn]] = []
        waiter = threading.Thread(target=acquire_and_note_time, args=(b, granted))
        waiter.start()
        wait_until_queued(client, b)
        yielded_at, start = time.time(), time.perf_counter()
        a.yield_()
        waiter.join()
        returned, returned_at, turn = granted[0]
        timings.append((returned - start) * 1000)
        if switches is not None:
            switches.append(turn.switch_seconds)
        if wall_clock is not None:
            wall_clock.append((yielded_at, returned_at))
        b.yield_()
    return timings


def print_segments(
    found: list[list[float]], handovers: int, floor: list[list[float]], floor_ms: float
) -> None:
    """The p50 of each hop, beside the same hop of the floor's update awaiting
    an activity (``floor``: floor_segments; ``floor_ms``: that update's p50);
    the hops do not add up to the hand-over's p50 (each has its own median,
    and the few tenths of a millisecond between one hop's end and the next's
    start are in none)."""
    print(f"\nwhere a hand-over's time goes ({len(found)} of {handovers} hand-overs, "
          "from the group's history timestamps), beside the floor's update awaiting "
          f"an activity ({len(floor)} of them):")  # fmt: skip
    rows = []
    floor_p50 = {
        name: p50_p90_p99([each[index] for each in floor])[0] if floor else float("nan")
        for index, name in enumerate(FLOOR_SEGMENTS)
    }
    for index, name in enumerate(SEGMENTS):
        p50, p90, _ = p50_p90_p99([each[index] for each in found])
        beside = f"{floor_p50[name]:.1f}" if name in floor_p50 else "-"
        rows.append([name, f"{p50:.1f}", f"{p90:.1f}", beside])
    print(table(["hop", "p50 ms", "p90 ms", "floor p50 ms"], rows))
    hops = sum(floor_p50.values())
    print(f"the floor's call and its answer's delivery, the rest of its {floor_ms:.1f} ms: "
          f"{floor_ms - hops:.1f} ms")  # fmt: skip


async def switch_times(directory: Path, switches: int) -> list[float]:
    """Milliseconds of each of the sim's switches (checkpoint + restore) between two jobs."""
    with tempfile.TemporaryDirectory(dir=directory) as state, tempfile.TemporaryDirectory() as log:
        sim = SimBackend(
            BackendConfig(
                node="n", sim_state_bytes=0, sim_state_path=str(Path(state) / "sim-state.json"),
                sim_record_path=str(Path(log) / "residency.jsonl"),
            )
        )  # fmt: skip
        await sim.restore("g", "a")
        times = []
        for n in range(switches):
            leaving, coming = ("a", "b") if n % 2 == 0 else ("b", "a")
            start = time.perf_counter()
            await sim.checkpoint("g", leaving)
            await sim.restore("g", coming)
            times.append((time.perf_counter() - start) * 1000)
            await asyncio.sleep(SIM_PAUSE_SECONDS)
        return times


def sim_switch(directory: Path, switches: int) -> None:
    times = asyncio.run(switch_times(directory, switches))
    p50, p90 = percentile(times, 50), percentile(times, 90)
    print(f"{switches} zero-byte switches, SIMULATED GPU, state in {directory}: "
          f"p50 {p50:.2f} ms, p90 {p90:.2f} ms")  # fmt: skip
    print(f"sim_switch_p50_ms={p50:.2f} sim_switch_p90_ms={p90:.2f}")


def two_nodes(iterations: int, state_gib: float, bandwidth_gbps: float) -> None:
    spans = {1: NODES[:1], 2: NODES}
    handover_ms: dict[int, list[float]] = {n: [] for n in spans}
    switch_ms: dict[int, list[float]] = {n: [] for n in spans}
    with running_stack(
        node=NODES[0], more_nodes=NODES[1:], state_gib=state_gib, bandwidth_gbps=bandwidth_gbps,
        sim_gpus=len(spans),
    ) as stack:  # fmt: skip
        print(f"stack ready; {iterations} hand-overs each", flush=True)
        with timeshare.connect(stack.address) as client:
            # Each group on a GPU of its own: a GPU is one group's at a time.
            pairs = {n: [client.join(f"span-{n}", f"job-{x}", nodes=nodes,
                                     policy=GroupPolicy(gpus=[n - 1])) for x in "ab"]
                     for n, nodes in spans.items()}  # fmt: skip
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
    print(f"\n{state_gib:g} GiB per job and node at {bandwidth_gbps:g} GB/s (SIMULATED)")
    print(table(["nodes", "on", "switch p50 ms", "p90", "hand-over p50 ms", "p90"], rows))
    s1, s2 = p50_p90_p99(switch_ms[1])[0], p50_p90_p99(switch_ms[2])[0]
    h1, h2 = p50_p90_p99(handover_ms[1])[0], p50_p90_p99(handover_ms[2])[0]
    print(
        f"switch_1node_p50_ms={s1:.1f} switch_2node_p50_ms={s2:.1f} switch_ratio={s2 / s1:.2f} "
        f"handover_1node_p50_ms={h1:.1f} handover_2node_p50_ms={h2:.1f} "
        f"handover_ratio={h2 / h1:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Hand-over latency against Temporal's floors.")
    parser.add_argument("--quick", action="store_true", help="40 iterations, --two-nodes 10")
    parser.add_argument("--iterations", type=int, help="default 200, --two-nodes 40")
    parser.add_argument("--transfer-reads", type=int, metavar="N", help="the embedded Temporal "
                        "reads its transfer queue at most N times a second (default "
                        f"{TRANSFER_QUEUE_READS_PER_SECOND}; Temporal's own is 20)")  # fmt: skip
    parser.add_argument("--sim-switch", type=Path, metavar="DIR",
                        help="only the sim's own switch, its state file in DIR")  # fmt: skip
    parser.add_argument("--switches", type=int, default=400, help="--sim-switch: how many")
    parser.add_argument("--two-nodes", action="store_true", help="two nodes against one")
    parser.add_argument("--state-gib", type=float, default=STATE_GIB,
                        help="--two-nodes: per job and node")  # fmt: skip
    parser.add_argument("--bandwidth-gbps", type=float, default=BANDWIDTH_GBPS)
    args = parser.parse_args()
    full, quick = (40, 10) if args.two_nodes else (200, 40)
    iterations = quick if args.quick else args.iterations or full
    if args.sim_switch:
        sim_switch(args.sim_switch, args.switches)
        return
    if args.two_nodes:
        two_nodes(iterations, args.state_gib, args.bandwidth_gbps)
        return
    reads = args.transfer_reads or TRANSFER_QUEUE_READS_PER_SECOND
    dynamic_config = f"--dynamic-config={TRANSFER_READS_SETTING}={reads}"
    blocks = min(BLOCKS, iterations)
    per_block = [iterations // blocks + (i < iterations % blocks) for i in range(blocks)]
    reacquire: list[float] = []
    handover: list[float] = []
    floor: dict[str, list[float]] = {}
    wall_clock: list[tuple[float, float]] = []
    floor_hops: list[list[float]] = []
    with running_stack(state_gib=0.0, temporal_options=[dynamic_config]) as stack:
        print(f"stack ready; {iterations} iterations each, in {blocks} blocks beside the "
              f"floor's; transfer queue read at most {reads} times a second",
              flush=True)  # fmt: skip
        beside = FloorBeside(stack.temporal, lambda address: connect_temporal(address, "default"))
        try:
            with timeshare.connect(stack.address) as client:
                a = client.join(GROUP, "job-a", nodes=[stack.node])
                b = client.join(GROUP, "job-b", nodes=[stack.node])
                for block, count in enumerate(per_block, 1):
                    reacquire += measure_reacquire(a, count)
                    handover += measure_handover(client, a, b, count, wall_clock=wall_clock)
                    pair = beside.time(count)
                    for name, times in pair.wall_ms.items():
                        floor.setdefault(name, []).extend(times)
                    floor_hops += floor_segments(pair.events)[-count:]  # not its warm-up
                    print(f"block {block} of {blocks} done", flush=True)
        finally:
            beside.close()

        async def group_history() -> list[Event]:
            temporal = await connect_temporal(stack.temporal, "default")
            return await history_events(temporal.get_workflow_handle(group_workflow_id(GROUP)))

        events = asyncio.run(group_history())
    rows = []
    for name, values in (
        ("re-acquire (no node action)", reacquire),
        ("hand-over (one switch activity)", handover),
        ("floor: trivial update", floor["update"]),
        ("floor: update awaiting one activity", floor["update+activity"]),
    ):
        p50, p90, p99 = p50_p90_p99(values)
        rows.append([name, f"{p50:.1f}", f"{p90:.1f}", f"{p99:.1f}"])
    print("\n" + table(["measure", "p50 ms", "p90 ms", "p99 ms"], rows))
    up50, act50 = percentile(floor["update"], 50), percentile(floor["update+activity"], 50)
    print_segments(all_segments(events, wall_clock), len(wall_clock), floor_hops, act50)
    re50, ho50, ho99 = p50_p90_p99(reacquire)[0], p50_p90_p99(handover)[0], p50_p90_p99(handover)[2]
    print(
        f"reacquire_p50_ms={re50:.1f} handover_p50_ms={ho50:.1f} handover_p99_ms={ho99:.1f} "
        f"floor_update_ms={up50:.1f} floor_activity_ms={act50:.1f} "
        f"reacquire_ratio={re50 / up50:.2f} handover_ratio={ho50 / act50:.2f} "
        f"transfer_reads={reads}"
    )


if __name__ == "__main__":
    main()
