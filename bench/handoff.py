"""Hand-over latency: re-acquire with nobody waiting, and a hand-over from A's
yield to waiting B's acquire returning, on one node with zero-byte switches
(sim backend), next to Temporal's own floors measured on the same server.

    python -m bench.handoff           # 200 iterations each
    python -m bench.handoff --quick   # 40
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path

import timeshare
from bench.floors import measure_floors
from bench.stack import LocalStack
from bench.stats import p50_p90_p99
from timeshare.status import table
from timeshare.workers.service import connect_temporal

GROUP = "handoff"


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


def acquire_and_note_time(job: timeshare.Job, granted: list[tuple[float, timeshare.Turn]]) -> None:
    turn = job.acquire()
    granted.append((time.perf_counter(), turn))


def measure_handoff(
    client: timeshare.Client,
    a: timeshare.Job,
    b: timeshare.Job,
    iterations: int,
    switches: list[float] | None = None,
) -> list[float]:
    """Milliseconds from A's yield to waiting B's acquire returning; the
    scheduler's own switch seconds of each hand-over go to ``switches``."""
    timings = []
    for _ in range(iterations):
        a.acquire()
        granted: list[tuple[float, timeshare.Turn]] = []
        waiter = threading.Thread(target=acquire_and_note_time, args=(b, granted))
        waiter.start()
        wait_until_queued(client, b)
        start = time.perf_counter()
        a.yield_()
        waiter.join()
        timings.append((granted[0][0] - start) * 1000)
        if switches is not None:
            switches.append(granted[0][1].switch_seconds)
        b.yield_()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description="Hand-over latency against Temporal's floors.")
    parser.add_argument("--quick", action="store_true", help="40 iterations instead of 200")
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()
    iterations = 40 if args.quick else args.iterations
    with tempfile.TemporaryDirectory() as scratch:
        stack = LocalStack(Path(scratch), state_gib=0.0)
        try:
            stack.start_all()
            print(f"stack ready; {iterations} iterations each", flush=True)
            with timeshare.connect(stack.address) as client:
                a = client.join(GROUP, "job-a", [stack.node])
                b = client.join(GROUP, "job-b", [stack.node])
                reacquire = measure_reacquire(a, iterations)
                print("re-acquire done", flush=True)
                handoff = measure_handoff(client, a, b, iterations)
                print("hand-over done", flush=True)

            async def floors() -> dict[str, list[float]]:
                return await measure_floors(
                    await connect_temporal(stack.temporal, "default"), iterations
                )

            floor = asyncio.run(floors())
        finally:
            stack.stop_all()
    rows = []
    for name, values in (
        ("re-acquire (no node action)", reacquire),
        ("hand-over (one switch activity)", handoff),
        ("floor: trivial update", floor["update"]),
        ("floor: update awaiting one activity", floor["update+activity"]),
    ):
        p50, p90, p99 = p50_p90_p99(values)
        rows.append([name, f"{p50:.1f}", f"{p90:.1f}", f"{p99:.1f}"])
    print()
    print(table(["measure", "p50 ms", "p90 ms", "p99 ms"], rows))
    re50, ho50, ho99 = p50_p90_p99(reacquire)[0], p50_p90_p99(handoff)[0], p50_p90_p99(handoff)[2]
    up50 = p50_p90_p99(floor["update"])[0]
    act50 = p50_p90_p99(floor["update+activity"])[0]
    print(
        f"reacquire_p50_ms={re50:.1f} handoff_p50_ms={ho50:.1f} handoff_p99_ms={ho99:.1f} "
        f"floor_update_ms={up50:.1f} floor_activity_ms={act50:.1f} "
        f"reacquire_ratio={re50 / up50:.2f} handoff_ratio={ho50 / act50:.2f}"
    )


if __name__ == "__main__":
    main()
