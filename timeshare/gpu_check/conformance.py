"""The backends' conformance to the driver: the checks that need no fault
injection, run against this host's CUDA driver by `timeshare gpu-check` (its
`conformance` step) and against the GPU emulator by the test suite.

Each job has two CUDA ranks (the emulator's CUDA worker, which runs on a real
driver as well), and the first rank has children that never touch CUDA, as a
DataLoader's workers. This process plays the node agent. The checks judge
only through what a GPU host has: the backend's own record
(BackendConfig.record_path) and actions, the driver's answer for a process's
state, and NVML.

    python -m timeshare.gpu_check.conformance --out DIR [--kinds cuda,freeze+cuda]

prints one `check=... backend=... status=ok|failed` line per check and
`conformance passed=N failed=M skipped=K` last; exit status 0 only when none
failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from timeshare.activities.backends.app import AppBackend
from timeshare.activities.backends.base import Backend, BackendConfig
from timeshare.activities.backends.cuda_checkpoint import CudaCheckpointBackend
from timeshare.activities.backends.cuda_driver import CudaDriverBackend
from timeshare.activities.backends.freeze import FreezeBackend
from timeshare.activities.backends.gpus import device_memory_by_pid
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.backends.sim import SimBackend
from timeshare.activities.backends.stacked import StackedBackend
from timeshare.gpu_check.emulator import CHECKPOINTED, LOCKED, RUNNING
from timeshare.gpu_check.emulator.rig import CudaWorker, process_state, start_worker
from timeshare.testing.processes import detached, kill

# The backends that act through the driver, in the order the check runs them.
GPU_KINDS = ("cuda", "cuda-checkpoint", "freeze+cuda", "app+cuda")
CUDA = {"cuda", "cuda-checkpoint", "freeze+cuda", "app+cuda"}
FREEZES = {"freeze+cuda", "freeze"}
GROUP = "g"


class CheckFailed(AssertionError):
    """A backend did not do what the check expects."""


def expect(condition: object, what: str) -> None:
    if not condition:
        raise CheckFailed(what)


@dataclass
class Job:
    name: str
    ranks: list[CudaWorker] = field(default_factory=list)

    @property
    def rank_pids(self) -> list[int]:
        return [rank.pid for rank in self.ranks]

    @property
    def children(self) -> list[int]:
        return sorted(child for rank in self.ranks for child in rank.children)


@dataclass
class Rig:
    """One backend, the processes it acts on, and what a host can observe of them."""

    kind: str
    backend: Backend
    table: ProcessTable
    directory: Path
    driver: ModuleType | None
    # Variables the CUDA ranks run with (the emulator's, on the emulator).
    env: dict[str, str]
    workers: list[CudaWorker] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.kind in CUDA

    @property
    def freezes(self) -> bool:
        return self.kind in FREEZES

    async def start_job(self, name: str, ranks: int = 2, children: int = 1) -> Job:
        if self.kind == "sim":
            await self.backend.restore(GROUP, name)  # the simulated job comes in
            return Job(name)
        job = Job(name)
        for index in range(ranks):
            worker = await asyncio.to_thread(
                start_worker, self.env, self.directory, f"{name}-{index}",
                children=children if index == 0 else 0,
            )  # fmt: skip
            self.workers.append(worker)
            job.ranks.append(worker)
            self.table.register(GROUP, name, worker.pid)
        # In pid order, as the backends list them.
        job.ranks.sort(key=lambda rank: rank.pid)
        return job

    def state(self, pid: int) -> int | None:
        assert self.driver is not None, "the sim backend has no driver"
        result, state = self.driver.cuCheckpointProcessGetState(pid)
        return None if int(result) else int(state)

    def states(self, job: Job) -> list[int | None]:
        return [self.state(pid) for pid in job.rank_pids]

    def record(self) -> list[dict[str, Any]]:
        path = self.directory / "record.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def acted_on(self, pids: list[int]) -> list[str]:
        """What the backend's own record says it did to these processes (a
        CUDA backend records each rank it moved)."""
        return [f"{e['event']} {e['pid']}" for e in self.record() if e.get("pid") in pids]

    def device_memory(self) -> dict[int, int | None]:
        """NVML's device bytes per process."""
        return device_memory_by_pid()

    def stop(self) -> None:
        for worker in self.workers:
            worker.kill()


def make_backend(kind: str, config: BackendConfig, driver: ModuleType | None,
                 utility: str = "cuda-checkpoint") -> Backend:  # fmt: skip
    def cuda() -> Backend:
        assert driver is not None
        return CudaDriverBackend(config, driver)

    if kind == "cuda":
        return cuda()
    if kind == "cuda-checkpoint":
        return CudaCheckpointBackend(config, utility)
    if kind == "freeze+cuda":
        return StackedBackend([FreezeBackend(config), cuda()])
    if kind == "app+cuda":
        return StackedBackend([AppBackend(config), cuda()])
    if kind == "freeze":
        return FreezeBackend(config)
    return SimBackend(config)


def backend_config(directory: Path, call_timeout_seconds: float) -> BackendConfig:
    return BackendConfig(
        node="n", lock_timeout_seconds=1.0, call_timeout_seconds=call_timeout_seconds,
        sim_state_bytes=2**20, sim_bandwidth_bytes_per_second=1e10,
        record_path=str(directory / "record.jsonl"),
    )  # fmt: skip


def stopped(pid: int) -> bool:
    return process_state(pid) in ("T", "t")


# -- lock, checkpoint, restore, unlock; each twice -------------------------------


async def round_trip_and_every_action_idempotent(rig: Rig) -> None:
    job = await rig.start_job("a")
    backend = rig.backend
    expect(await backend.resident_jobs(GROUP) == ["a"], "a started job is resident")

    done = await backend.checkpoint(GROUP, "a")
    expect(done.action == "checkpoint", f"checkpoint answered {done.action}")
    again = (await backend.checkpoint(GROUP, "a")).action
    expect(again == "noop", f"a second checkpoint answered {again}, not noop")
    expect(await backend.resident_jobs(GROUP) == [], "a checkpointed job is still resident")
    if rig.cuda:
        states = rig.states(job)
        expect(states == [CHECKPOINTED, CHECKPOINTED], f"checkpointed ranks' states: {states}")
        cuda_ranks = sorted(r.pid for r in done.ranks if r.action == "checkpoint")
        expect(cuda_ranks == job.rank_pids,
               f"ranks reported {cuda_ranks}, not exactly {job.rank_pids}")  # fmt: skip
        memory = rig.device_memory()
        holding = set(job.rank_pids) & {pid for pid, count in memory.items() if count}
        expect(not holding, f"NVML still shows device memory for checkpointed ranks {holding}")
        recorded = sorted(e["pid"] for e in rig.record() if e["event"] == "checkpoint")
        expect(recorded == job.rank_pids, f"the record names ranks {recorded}")
    if rig.freezes:
        expect(all(stopped(pid) for pid in job.rank_pids + job.children), "not all frozen")

    restored = await backend.restore(GROUP, "a")
    expect(restored.action == "restore", f"restore answered {restored.action}")
    again = (await backend.restore(GROUP, "a")).action
    expect(again == "noop", f"a second restore answered {again}, not noop")
    expect(await backend.resident_jobs(GROUP) == ["a"], "a restored job is not resident")
    if rig.cuda:
        states = rig.states(job)
        expect(states == [RUNNING, RUNNING], f"restored ranks' states: {states}")
    for rank in job.ranks:
        await asyncio.to_thread(rank.advancing)

    locked = (await backend.lock(GROUP, "a")).action
    expect(locked == "lock", f"lock answered {locked}")
    again = (await backend.lock(GROUP, "a")).action
    expect(again == "noop", f"a second lock answered {again}, not noop")
    if rig.cuda:
        states = rig.states(job)
        expect(states == [LOCKED, LOCKED], f"locked ranks' states: {states}")
        expect(await backend.resident_jobs(GROUP) == ["a"], "a locked job left the device")
    unlocked = await backend.restore(GROUP, "a")
    answer = (unlocked.action, unlocked.bytes)
    expect(answer == ("unlock", 0), f"restoring a locked job answered {answer}")
    if rig.cuda:
        states = rig.states(job)
        expect(states == [RUNNING, RUNNING], f"unlocked ranks' states: {states}")
    for rank in job.ranks:
        await asyncio.to_thread(rank.advancing)


# -- processes without CUDA -------------------------------------------------------


async def processes_without_cuda_are_never_acted_on(rig: Rig) -> list[int]:
    """Returns the processes without CUDA, for witnesses a host lacks (the
    emulator's call log)."""
    job = await rig.start_job("a", children=2)
    backend = rig.backend
    for action in (backend.checkpoint, backend.restore, backend.lock, backend.restore):
        done = await action(GROUP, "a")
        expect(done.action != "noop", f"{action.__name__} did nothing")
        if rig.cuda and not rig.freezes:
            expect(done.pids == job.rank_pids, f"{action.__name__} acted on {done.pids}")
        if action == backend.checkpoint and not rig.freezes:
            # Left alone: the data loaders run on while the ranks are checkpointed.
            await runs_on(job.ranks[0])
        if action == backend.checkpoint and rig.freezes:
            expect(all(stopped(pid) for pid in job.children), "a child was not frozen")
    expect(rig.acted_on(job.children) == [], f"acted on children: {rig.acted_on(job.children)}")
    if rig.cuda:
        expect(rig.acted_on(job.rank_pids), "the record names no rank")
    expect(not any(stopped(pid) for pid in job.children), "a child was left frozen")

    # A job with no CUDA process at all: nothing for the driver to move.
    sleeper = detached("sleep", "60")
    try:
        rig.table.register(GROUP, "plain", sleeper)
        done = await backend.checkpoint(GROUP, "plain")
        wanted = "checkpoint" if rig.freezes else "noop"
        expect(done.action == wanted, f"a job without CUDA: {done.action}, not {wanted}")
        expect(stopped(sleeper) == rig.freezes, "a job without CUDA frozen or not as expected")
        await backend.restore(GROUP, "plain")
        expect(rig.acted_on([sleeper]) == [], "the driver acted on a process without CUDA")
    finally:
        kill(sleeper)
    return [*job.children, sleeper]


async def runs_on(rank: CudaWorker) -> None:
    before = rank.child_count(0)
    deadline = asyncio.get_running_loop().time() + 30
    while rank.child_count(0) <= before:
        if asyncio.get_running_loop().time() > deadline:
            raise CheckFailed("a non-CUDA child stopped while its rank was checkpointed")
        await asyncio.sleep(0.02)


Check = Callable[[Rig], Awaitable[object]]
CHECKS: dict[str, Check] = {
    "round_trip": round_trip_and_every_action_idempotent,
    "no_cuda_left_alone": processes_without_cuda_are_never_acted_on,
}


# -- against this host's driver -------------------------------------------------------


def real_driver() -> ModuleType:
    from cuda.bindings import driver

    (result,) = driver.cuInit(0)
    if int(result):
        raise RuntimeError(f"cuInit failed: {result}")
    module: ModuleType = driver
    return module


async def run_checks(kinds: list[str], out: Path, utility: str) -> tuple[int, int, int]:
    driver = real_driver()
    passed = failed = skipped = 0
    for kind in kinds:
        for name, check in CHECKS.items():
            if kind == "cuda-checkpoint" and shutil.which(utility) is None:
                print(f"check={name} backend={kind} status=skipped reason=\"{utility} is not on "
                      "PATH\"", flush=True)  # fmt: skip
                skipped += 1
                continue
            directory = Path(tempfile.mkdtemp(prefix=f"{kind}-{name}-", dir=out))
            table = ProcessTable()
            # A real driver moves a rank's CUDA context (hundreds of MiB) per call.
            backend = make_backend(kind, backend_config(directory, 60.0), driver, utility)
            backend.attach(table)
            rig = Rig(kind, backend, table, directory, driver, env={})
            try:
                await check(rig)
            except Exception as error:
                failed += 1
                (directory / "traceback.txt").write_text(traceback.format_exc())
                reason = json.dumps(f"{type(error).__name__}: {error}")
                print(f"check={name} backend={kind} status=failed reason={reason}", flush=True)
            else:
                passed += 1
                print(f"check={name} backend={kind} status=ok", flush=True)
            finally:
                rig.stop()
    return passed, failed, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m timeshare.gpu_check.conformance",
        description="The backends against this host's driver.",
    )
    parser.add_argument("--out", type=Path, required=True, help="where each check's files go")
    parser.add_argument("--kinds", default=",".join(GPU_KINDS),
                        help=f"comma-separated backends, of {', '.join(GPU_KINDS)}")  # fmt: skip
    parser.add_argument("--utility", default="cuda-checkpoint", help="NVIDIA's utility")
    args = parser.parse_args(argv)
    kinds = [kind for kind in args.kinds.split(",") if kind]
    if set(kinds) - set(GPU_KINDS):
        parser.error(f"no backend {', '.join(sorted(set(kinds) - set(GPU_KINDS)))}")
    args.out.mkdir(parents=True, exist_ok=True)
    passed, failed, skipped = asyncio.run(run_checks(kinds, args.out, args.utility))
    print(f"conformance passed={passed} failed={failed} skipped={skipped}", flush=True)
    return 0 if passed and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
