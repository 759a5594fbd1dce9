"""The sim backend with jobs whose states differ in size (--sim-job-state):
each checkpoint moves the job's own bytes, and what fits beside what is
reckoned with each job's own size. SIMULATED GPU."""

from __future__ import annotations

import pytest

from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.sim import SimBackend, SimOverlapError

GIB = 2**30


def sized_sim(capacity_gib: float | None) -> SimBackend:
    return SimBackend(
        BackendConfig(
            node="n",
            sim_state_bytes=1 * GIB,
            sim_job_state_bytes={"big": 3 * GIB},
            sim_capacity_bytes=int(capacity_gib * GIB) if capacity_gib else None,
            sim_bandwidth_bytes_per_second=1e15,
        )
    )


async def test_each_job_moves_its_own_state() -> None:
    sim = sized_sim(None)
    await sim.restore("g", "big")
    assert (await sim.checkpoint("g", "big")).bytes == 3 * GIB
    await sim.restore("g", "small")
    assert (await sim.checkpoint("g", "small")).bytes == 1 * GIB
    # Brought back, the big one moves its 3 GiB again.
    assert (await sim.restore("g", "big")).bytes == 3 * GIB


async def test_what_fits_is_reckoned_with_each_jobs_size() -> None:
    sim = sized_sim(4.0)
    await sim.restore("g", "big")
    await sim.lock("g", "big")
    assert await sim.free_memory("g") == {"sim-gpu-0": 1 * GIB}
    await sim.restore("g", "small")  # 3 + 1 GiB: fits exactly
    await sim.lock("g", "small")
    with pytest.raises(SimOverlapError, match="does not fit"):
        await sim.restore("g", "other")
    assert await sim.footprint("g", "big") == {"sim-gpu-0": 3 * GIB}


async def test_restores_move_at_their_own_bandwidth() -> None:
    # Checkpoints at 8 GiB/s, restores at 1: the same 0.3 GiB takes at least
    # 0.3 s to come back (at the checkpoints' speed it would take 0.04 s).
    sim = SimBackend(
        BackendConfig(
            node="n",
            sim_state_bytes=int(0.3 * GIB),
            sim_bandwidth_bytes_per_second=8 * GIB,
            sim_restore_bandwidth_bytes_per_second=1 * GIB,
        )
    )
    await sim.restore("g", "a")
    saved = await sim.checkpoint("g", "a")
    restored = await sim.restore("g", "a")
    assert saved.bytes == restored.bytes == int(0.3 * GIB)
    assert restored.seconds >= 0.3
    assert "1.07374 GB/s restoring" in sim.describe()
