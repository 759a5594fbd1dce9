"""What one zero-byte switch costs the sim backend itself, with nothing else running.

What one zero-byte switch costs the sim backend itself (SIMULATED GPU):
checkpoint one job, restore the other, with the sim's state file in a
directory of your choice, nothing else running. It tells the sim's own
bookkeeping (its state file, its record) from the scheduler's and
Temporal's part of a hand-over.

    python -m bench sim_switch --dir /dev/shm   # tmpfs, as timeshare.testing.stack keeps it
    python -m bench sim_switch --dir /tmp       # the disk
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.parts.stats import percentile
from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.sim import SimBackend

# A pause between switches, as a hand-over leaves between its switches.
PAUSE_SECONDS = 0.003


async def switch_times(directory: Path, switches: int) -> list[float]:
    """Milliseconds of each switch (checkpoint + restore) between two jobs."""
    with tempfile.TemporaryDirectory(dir=directory) as state, tempfile.TemporaryDirectory() as log:
        sim = SimBackend(
            BackendConfig(
                node="n",
                sim_state_bytes=0,
                sim_state_path=str(Path(state) / "sim-state.json"),
                sim_record_path=str(Path(log) / "residency.jsonl"),
            )
        )
        await sim.restore("g", "a")
        times = []
        for n in range(switches):
            leaving, coming = ("a", "b") if n % 2 == 0 else ("b", "a")
            start = time.perf_counter()
            await sim.checkpoint("g", leaving)
            await sim.restore("g", coming)
            times.append((time.perf_counter() - start) * 1000)
            await asyncio.sleep(PAUSE_SECONDS)
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description="One zero-byte sim switch, alone.")
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm"), help="where the state is")
    parser.add_argument("--switches", type=int, default=400)
    args = parser.parse_args()
    times = asyncio.run(switch_times(args.dir, args.switches))
    p50, p90 = percentile(times, 50), percentile(times, 90)
    print(f"{args.switches} zero-byte switches, SIMULATED GPU, state in {args.dir}: "
          f"p50 {p50:.2f} ms, p90 {p90:.2f} ms")  # fmt: skip
    print(f"sim_switch_p50_ms={p50:.2f} sim_switch_p90_ms={p90:.2f}")


if __name__ == "__main__":
    main()
