"""A hand-over's CPU in the workflow worker, layer by layer, up to GroupWorkflow.

What a hand-over costs the workflow worker, layer by layer, measured side
by side in one window on one Temporal dev server: the floor
`worker_cpu_ratio` divides by (a trivial update plus an update awaiting a
remote activity, bench.parts.floors), then the hand-over-shaped layers of
bench.parts.handover_floors, up to timeshare's own GroupWorkflow. Each runs in a
worker process of its own, activations inline as the scheduler runs them,
as many workflows each, paced as bench.scale paces its groups (a hand-over
per workflow every period, the next job asking half a period before).

    python -m bench handover_layers            # 25 workflows each, 3 rounds of 30 s
    python -m bench handover_layers --quick    # one round of 20 s
    python -m bench handover_layers --floor-defaults   # the floor on the SDK's thread pool

Each round's figures are CPU milliseconds per hand-over (per pair for the
floor) and each layer's ratio to the floor of the same round; the last line
gives the medians over the rounds: ``pair_floor_cpu_ms`` (with
``pair_floor_inline``, 0 under ``--floor-defaults``) and, per layer,
``<layer>_ratio``, and ``group_over_shape`` (what timeshare adds to the
protocol's bare shape).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import statistics
from pathlib import Path

from bench.parts.floors import PacedFloor, PacedFloorCpu
from bench.parts.handover_floors import LAYERS
from bench.parts.procstat import load_average
from timeshare.models import GroupPolicy
from timeshare.status import table
from timeshare.testing import temporal_only
from timeshare.workers.common.service import connect_temporal

PAIR = "pair floor"
# The group layer's jobs hold their turns with the default policy's lease.
MAX_PERIOD = GroupPolicy().lease_seconds / 2


async def one_round(
    temporal: str, workdir: Path, args: argparse.Namespace, seed: int
) -> dict[str, PacedFloorCpu]:
    """Every layer and the pair floor, paced in one window."""
    client = await connect_temporal(temporal, "default")
    workflows, period, seconds = args.workflows, args.period, args.seconds
    async with contextlib.AsyncExitStack() as stack:
        pair = PacedFloor(
            client, temporal, workflows, period, workdir, seed, inline=not args.floor_defaults
        )
        floors = {PAIR: pair}
        for offset, layer in enumerate(LAYERS.values(), start=1):
            floors[layer.name] = PacedFloor(
                client, temporal, workflows, period, workdir, seed + offset, inline=True,
                layer=layer,
            )  # fmt: skip
        for name, floor in floors.items():
            await stack.enter_async_context(floor)
            print(f"  {name}: {workflows} workflows started and warmed up", flush=True)
        with contextlib.ExitStack() as windows:
            for floor in floors.values():
                windows.enter_context(floor.window(seconds))
            await asyncio.sleep(seconds)
    results: dict[str, PacedFloorCpu] = {}
    for name, floor in floors.items():
        assert floor.result is not None
        results[name] = floor.result
    return results


def ratios(results: dict[str, PacedFloorCpu]) -> dict[str, float]:
    floor = results[PAIR].cpu_ms_per_pair
    return {name: r.cpu_ms_per_pair / floor for name, r in results.items() if name != PAIR}


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
    medians = {
        name: statistics.median(ratios(results)[name] for results in rounds)
        for name in names
        if name != PAIR
    }
    floor_ms = statistics.median(results[PAIR].cpu_ms_per_pair for results in rounds)
    over_shape = statistics.median(
        results["group"].cpu_ms_per_pair / results["shape"].cpu_ms_per_pair for results in rounds
    )
    print(f"machine: {platform.node()} {platform.platform()}; load average {load_average()}")
    print(
        f"rounds={len(rounds)} pair_floor_inline={int(rounds[0][PAIR].inline)} "
        f"pair_floor_cpu_ms={floor_ms:.2f} "
        + " ".join(f"{name}_ratio={value:.2f}" for name, value in medians.items())
        + f" group_over_shape={over_shape:.2f}"
    )


async def run(args: argparse.Namespace, temporal: str, workdir: Path) -> None:
    rounds = []
    for index in range(args.rounds):
        print(f"round {index + 1} of {args.rounds}: {args.seconds:g} s (load {load_average()})",
              flush=True)  # fmt: skip
        logs = workdir / f"round-{index + 1}"  # each round's workers write logs of their own
        logs.mkdir()
        seed = args.seed + 10 * index
        rounds.append(await one_round(temporal, logs, args, seed))
    report(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description="A hand-over's CPU, layer by layer.")
    parser.add_argument("--quick", action="store_true", help="one round of 20 s")
    parser.add_argument("--workflows", type=int, default=25, help="per layer (default 25)")
    parser.add_argument("--period", type=float, default=5.0, help="seconds between hand-overs")
    parser.add_argument("--seconds", type=float, help="per round (default 30, quick 20)")
    parser.add_argument("--rounds", type=int, help="default 3, quick 1")
    parser.add_argument(
        "--floor-defaults", action="store_true",
        help="the pair floor's worker on the SDK's defaults (activations on its thread pool), "
        "as worker_cpu_ratio's floor is; default: inline, as the layers and the scheduler",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.workflows < 1 or not 0 < args.period <= MAX_PERIOD:
        # A holder yields a period after its grant: past its lease, it would be evicted.
        parser.error(f"--workflows must be at least 1, --period over 0 and at most {MAX_PERIOD:g}")
    args.seconds = args.seconds or (20.0 if args.quick else 30.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    with temporal_only() as stack:
        print(f"Temporal ready (load {load_average()})", flush=True)
        asyncio.run(run(args, stack.temporal, stack.workdir))


if __name__ == "__main__":
    main()
