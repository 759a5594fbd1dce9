"""A release that reaches the agent late: the job left, its release was on
its way (a slow or retried activity), and meanwhile the job joined its group
again. The release names the membership that ended; the agent lets go of
nothing that belongs to the job that is back, and a job the scheduler names
as a member again is switched as one, whatever a release did before. On the
GPU emulator; this test process plays the agent."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from tests.cuda_backends import MiB, backend_of, read_emulated_nvml, start_job
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.switch import SwitchActivities
from timeshare.gpu_check.emulator import CHECKPOINTED, RUNNING
from timeshare.gpu_check.emulator.rig import CudaWorker, Emulator
from timeshare.models import NodeMove, ReleaseInput, ReleaseOutput, SwitchInput


@pytest.fixture(autouse=True)
def emulated_nvml(gpu_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    read_emulated_nvml(monkeypatch, gpu_emulator)


def switch(plan: int, admit: str, evict: list[str], incarnations: dict[str, int]) -> SwitchInput:
    return SwitchInput(
        group="g", epoch=plan, plan=plan, co_residency="off", incarnations=incarnations,
        move=NodeMove(node="n", admit=admit, evict=evict),
    )  # fmt: skip


async def release(agent: SwitchActivities, job: str, incarnation: int) -> ReleaseOutput:
    output: ReleaseOutput = await ActivityEnvironment().run(
        agent.release, ReleaseInput(group="g", job=job, incarnation=incarnation)
    )
    return output


async def test_a_late_release_leaves_the_rejoined_jobs_processes_to_it(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker]
) -> None:
    emu, table = gpu_emulator, ProcessTable()
    agent = SwitchActivities("n", backend_of("cuda", emu, table), table)
    (a,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, nbytes=64 * MiB).pids
    (b,) = start_job(emu, tmp_path, cuda_workers, table, "b", ranks=1, nbytes=64 * MiB).pids
    await ActivityEnvironment().run(agent.switch, switch(1, "a", ["b"], {"a": 1, "b": 2}))
    # a left (membership 1) and joined again (membership 3), and holds the
    # GPU again before its first membership's release reaches the agent.
    await ActivityEnvironment().run(agent.switch, switch(2, "a", ["b"], {"a": 3, "b": 2}))
    late = await release(agent, "a", incarnation=1)
    assert "not released" in late.summary and late.running == []
    assert not table.released("g", "a")
    # b's turn: a is the group's, so its state leaves the GPU for b's.
    await ActivityEnvironment().run(agent.switch, switch(3, "b", ["a"], {"a": 3, "b": 2}))
    assert emu.state(a) == (0, CHECKPOINTED) and emu.state(b) == (0, RUNNING)


async def test_a_job_named_a_member_again_is_switched_as_one_after_a_late_release(
    gpu_emulator: Emulator, tmp_path: Path, cuda_workers: list[CudaWorker]
) -> None:
    """The rejoined job was granted with no switch (its state never left the
    GPU), so the late release found nothing newer and let it go; the next
    switch that names it a member makes it the group's again."""
    emu, table = gpu_emulator, ProcessTable()
    agent = SwitchActivities("n", backend_of("cuda", emu, table), table)
    (a,) = start_job(emu, tmp_path, cuda_workers, table, "a", ranks=1, nbytes=64 * MiB).pids
    (b,) = start_job(emu, tmp_path, cuda_workers, table, "b", ranks=1, nbytes=64 * MiB).pids
    await ActivityEnvironment().run(agent.switch, switch(1, "a", ["b"], {"a": 1, "b": 2}))
    await release(agent, "a", incarnation=1)
    assert table.released("g", "a")
    await ActivityEnvironment().run(agent.switch, switch(2, "b", ["a"], {"a": 3, "b": 2}))
    assert not table.released("g", "a")
    assert emu.state(a) == (0, CHECKPOINTED) and emu.state(b) == (0, RUNNING)
    # A release of the membership that is the group's now still lets it go.
    assert (await release(agent, "a", incarnation=3)).summary.startswith("job g/a released")
    assert table.released("g", "a")
