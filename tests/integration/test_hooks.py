"""Workload hooks end to end on real processes: a job process serves the
vLLM server hooks to an agent socket (this test plays the agent, backend
app+sim), against a fake engine that records when each call came. The sleep
comes before the checkpoint and the wake-up after the restore, in both modes;
a hook that hangs or fails fails the switch with its own message."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from tests.credentials import known_jobs, token_env, token_of
from tests.fakes.engine import FakeEngine, running_engine
from tests.polling import async_check, wait_until_async
from tests.processes import detached, kill
from timeshare.activities.backends.app import AppBackend
from timeshare.activities.backends.base import Backend, BackendConfig
from timeshare.activities.backends.cuda_driver import CudaDriverBackend
from timeshare.activities.backends.hook_registry import HookRegistry
from timeshare.activities.backends.loading import load_backend
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.backends.sim import SimBackend
from timeshare.activities.backends.stacked import StackedBackend
from timeshare.activities.switch import SwitchActivities
from timeshare.errors import FailedPrecondition
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator.rig import Emulator, nvml_device_memory, start_worker
from timeshare.hooks import WorkloadHooks, serve_hooks
from timeshare.hooks.protocol import EvictMode
from timeshare.models import FailureKind, NodeMove, SwitchInput
from timeshare.workers.agent.registration_socket import serve_agent_socket

HOOK_TIMEOUT = 2.0


@dataclass
class Agent:
    """This test process as a node agent: socket, hooks, backend, switches."""

    path: str
    hooks: HookRegistry
    backend: Backend
    switches: SwitchActivities
    epoch: int = 0

    async def admit(self, job: str, evict: list[str]) -> None:
        self.epoch += 1
        move = NodeMove(node="n", admit=job, evict=evict)
        given = SwitchInput(group="g", epoch=self.epoch, move=move, plan=self.epoch)
        await ActivityEnvironment().run(self.switches.switch, given)

    async def quiesce(self, evict: list[str]) -> None:
        self.epoch += 1
        move = NodeMove(node="n", admit="", evict=evict)
        given = SwitchInput(
            group="g", epoch=self.epoch, move=move, plan=self.epoch, phase="quiesce"
        )
        await ActivityEnvironment().run(self.switches.switch, given)

    async def wait_for_hooks(self, job: str) -> None:
        await wait_until_async(
            async_check(lambda: self.hooks.connections("g", job)), f"job {job} to serve its hooks"
        )


CONFIG = BackendConfig(
    node="n", sim_state_bytes=2**20, sim_bandwidth_bytes_per_second=1e10,
    hook_timeout_seconds=HOOK_TIMEOUT,
)  # fmt: skip


@contextlib.asynccontextmanager
async def running_agent(path: str, backend: Backend) -> AsyncIterator[Agent]:
    processes, hooks = ProcessTable(), HookRegistry()
    backend.attach(processes)
    backend.attach_hooks(hooks)
    async with await serve_agent_socket(path, processes, hooks, credentials=known_jobs()):
        yield Agent(path, hooks, backend, SwitchActivities("n", backend, processes))
        hooks.close_all()


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    async with running_agent(str(tmp_path / "agent.sock"), load_backend("app+sim", CONFIG)) as up:
        yield up


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    with running_engine() as started:
        yield started


@pytest.fixture
def start_job(agent: Agent, engine: FakeEngine) -> Iterator[Callable[[EvictMode], int]]:
    """Start job a's process, serving the vLLM server hooks; its pid."""
    started: list[int] = []

    def start(mode: EvictMode) -> int:
        command = ["-m", "tests.hook_process", agent.path, "g", "a", mode, engine.url]
        started.append(detached(sys.executable, *command, env=token_env("a")))
        return started[-1]

    yield start
    for pid in started:
        kill(pid)


def sim_event(agent: Agent, event: str, job: str, nth: int = 0) -> dict[str, Any]:
    assert isinstance(agent.backend, StackedBackend)
    sim = agent.backend.layers[1]
    assert isinstance(sim, SimBackend)
    return [e for e in sim.events if e["event"] == event and e["job"] == job][nth]


EXPECTED = {
    "offload": ["/sleep?level=1&mode=wait", "/wake_up"],
    "discard": ["/sleep?level=2&mode=wait", "/wake_up?tags=weights", "/collective_rpc",
                "/wake_up?tags=kv_cache"],
}  # fmt: skip


@pytest.mark.parametrize("mode", ["offload", "discard"])
async def test_the_engine_sleeps_before_the_checkpoint_and_wakes_after_the_restore(
    agent: Agent, engine: FakeEngine, start_job: Callable[[EvictMode], int], mode: EvictMode
) -> None:
    start_job(mode)
    await agent.wait_for_hooks("a")
    await agent.admit("a", [])
    assert engine.requests == []  # admitted for the first time: nothing was put away
    await agent.admit("b", ["a"])
    await agent.admit("a", ["b"])
    assert engine.paths() == EXPECTED[mode]
    if mode == "discard":
        assert engine.posts()[2].body == {"method": "reload_weights"}
    checkpoint = sim_event(agent, "checkpoint", "a")
    assert checkpoint["mode"] == mode  # the job's own choice reached the device
    assert engine.posts()[0].at <= checkpoint["start"]
    assert engine.posts()[-1].at >= sim_event(agent, "restore", "a", nth=1)["end"]


async def test_a_hook_that_hangs_fails_the_switch_with_its_message(
    agent: Agent, engine: FakeEngine, start_job: Callable[[EvictMode], int]
) -> None:
    pid = start_job("offload")
    await agent.wait_for_hooks("a")
    await agent.admit("a", [])
    engine.hang_on.add("/sleep")
    with pytest.raises(ApplicationError) as failure:
        await agent.admit("b", ["a"])
    # The job's own hook: the scheduler evicts that job once retries are spent.
    assert failure.value.type == FailureKind.HOOK and failure.value.details == ("a",)
    assert f"evict(offload) hook of process {pid}" in failure.value.message
    assert f"did not answer within {HOOK_TIMEOUT:g} s" in failure.value.message
    assert await agent.backend.resident_jobs("g") == ["a"]  # nothing moved


async def test_a_hook_that_fails_fails_the_restore_with_the_engines_words(
    agent: Agent, engine: FakeEngine, start_job: Callable[[EvictMode], int]
) -> None:
    start_job("offload")
    await agent.wait_for_hooks("a")
    await agent.admit("a", [])
    await agent.admit("b", ["a"])
    engine.failures["/wake_up"] = (500, "CUDA out of memory")
    with pytest.raises(ApplicationError) as failure:
        await agent.admit("a", ["b"])
    assert failure.value.type == FailureKind.RESTORE
    assert "admit() hook" in failure.value.message
    assert "HTTP 500 CUDA out of memory" in failure.value.message


@contextlib.asynccontextmanager
async def two_ranks(
    tmp_path: Path, engine: FakeEngine, emu: Emulator
) -> AsyncIterator[tuple[Agent, list[int]]]:
    """An app+cuda agent (the CUDA driver is the GPU emulator's, through the
    real cuda-bindings) and two CUDA ranks of job a serving the vLLM server
    hooks; their pids."""
    backend = StackedBackend([AppBackend(CONFIG), CudaDriverBackend(CONFIG, emu.driver)])
    command = ["-m", "tests.hook_process", str(tmp_path / "agent.sock"), "g", "a", "offload"]
    environment = [f"{name}={value}" for name, value in {**emu.env, **token_env("a")}.items()]
    ranks = [
        detached("env", *environment, sys.executable, *command, engine.url, "cuda")
        for _ in range(2)
    ]
    try:
        async with running_agent(str(tmp_path / "agent.sock"), backend) as agent:
            await wait_until_async(
                async_check(lambda: len(agent.hooks.connections("g", "a")) == 2),
                "both ranks to serve their hooks",
            )
            yield agent, ranks
    finally:
        for rank in ranks:
            kill(rank)


def driver_calls(emu: Emulator, pids: list[int]) -> list[tuple[str, float]]:
    """The checkpoint calls this process made on ``pids``, in order: (action,
    wall-clock time it began). The emulator logs CLOCK_MONOTONIC."""
    offset = time.time() - time.monotonic()
    return [
        (entry["call"].removeprefix("cuCheckpointProcess").lower(), entry["t"] + offset)
        for entry in emulator.read_log(emu.log)
        if entry["caller"] == os.getpid() and entry["pid"] in pids and entry["phase"] == "begin"
        and entry["call"] in {f"cuCheckpointProcess{a}" for a in
                              ("Lock", "Checkpoint", "Restore", "Unlock")}
    ]  # fmt: skip


async def test_every_rank_puts_its_state_away_before_any_is_locked(
    tmp_path: Path, engine: FakeEngine, gpu_emulator: Emulator
) -> None:
    """app+cuda with two ranks of one job: both hooks, then both locks, then
    both checkpoints; on the way back, both restores, both unlocks, then the
    hooks."""
    async with two_ranks(tmp_path, engine, gpu_emulator) as (agent, ranks):
        await agent.admit("b", ["a"])
        sleeps = [r.at for r in engine.posts()]
        assert engine.paths() == ["/sleep?level=1&mode=wait"] * 2
        calls = driver_calls(gpu_emulator, ranks)
        assert [action for action, _ in calls] == ["lock"] * 2 + ["checkpoint"] * 2
        assert max(sleeps) <= min(at for _, at in calls)
        restored_from = len(calls)
        await agent.admit("a", ["b"])
        back = driver_calls(gpu_emulator, ranks)[restored_from:]
        assert [action for action, _ in back] == ["restore"] * 2 + ["unlock"] * 2
        assert engine.paths()[2:] == ["/wake_up"] * 2
        assert min(r.at for r in engine.posts()[2:]) >= max(at for _, at in back)


async def test_a_job_on_several_nodes_is_stopped_before_the_checkpoint_phase(
    tmp_path: Path, engine: FakeEngine, gpu_emulator: Emulator
) -> None:
    """The first phase of a switch that a job leaves on several nodes: its
    hooks and its locks, nothing moved; the second phase only checkpoints."""
    async with two_ranks(tmp_path, engine, gpu_emulator) as (agent, ranks):
        await agent.quiesce(["a"])
        assert engine.paths() == ["/sleep?level=1&mode=wait"] * 2
        assert [a for a, _ in driver_calls(gpu_emulator, ranks)] == ["lock"] * 2
        await agent.admit("b", ["a"])
        assert engine.paths() == ["/sleep?level=1&mode=wait"] * 2  # not put away twice
        assert [a for a, _ in driver_calls(gpu_emulator, ranks)] == ["lock"] * 2 + [
            "checkpoint"
        ] * 2


class Recorder(WorkloadHooks):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def evict(self, mode: EvictMode) -> None:
        self.calls.append(f"evict {mode}")

    def admit(self) -> None:
        self.calls.append("admit")


async def test_hooks_come_back_after_the_agent_restarts_knowing_where_they_stand(
    agent: Agent,
) -> None:
    recorder = Recorder()
    served = await asyncio.to_thread(
        serve_hooks,
        recorder,
        "g",
        "a",
        agent.path,
        mode="discard",
        register=False,
        token=token_of("a"),
    )
    try:
        await agent.wait_for_hooks("a")
        connection = agent.hooks.connections("g", "a")[0]
        await connection.call("evict", "discard", HOOK_TIMEOUT)
        await connection.call("evict", "discard", HOOK_TIMEOUT)  # answered, not repeated
        assert recorder.calls == ["evict discard"]

        # The agent goes away and another takes its socket.
        agent.hooks.close_all()
        restarted = HookRegistry()
        restarted.accepting = True
        async with await serve_agent_socket(
            agent.path, ProcessTable(), restarted, credentials=known_jobs()
        ):
            for _ in range(200):
                if restarted.connections("g", "a"):
                    break
                await asyncio.sleep(0.05)
            again = restarted.connections("g", "a")[0]
            assert again.evicted and again.mode == "discard"
            await again.call("admit", None, HOOK_TIMEOUT)
            restarted.close_all()
        assert recorder.calls == ["evict discard", "admit"]
    finally:
        await asyncio.to_thread(served.close)


async def test_an_agent_that_calls_no_hooks_refuses_them(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    async with await serve_agent_socket(
        path, ProcessTable(), HookRegistry(), credentials=known_jobs()
    ):
        with pytest.raises(FailedPrecondition, match="app\\+cuda"):
            await asyncio.to_thread(
                serve_hooks, Recorder(), "g", "a", path, register=False, token=token_of("a")
            )


async def test_a_job_that_leaves_is_woken_as_at_an_admission_once_the_gpu_is_free(
    agent: Agent, engine: FakeEngine, start_job: Callable[[EvictMode], int]
) -> None:
    """A released vLLM or SGLang engine must not stay asleep: nobody would
    ever admit it again. Nor may it wake beside the job that holds the GPU
    (co-residency off): it wakes once that job is gone."""
    pid = start_job("offload")
    await agent.wait_for_hooks("a")
    await agent.admit("a", [])
    await agent.admit("b", ["a"])
    assert engine.paths() == ["/sleep?level=1&mode=wait"]
    released = await agent.switches.release_job("g", "a")
    assert engine.paths() == ["/sleep?level=1&mode=wait"]
    assert f"admit hooks of [{pid}] not called: its device state is still parked" in (
        released.summary
    )
    await agent.switches.release_job("g", "b")
    assert engine.paths() == ["/sleep?level=1&mode=wait", "/wake_up"]


async def test_a_job_left_parked_on_release_is_not_woken_into_blocked_calls(
    tmp_path: Path,
    engine: FakeEngine,
    gpu_emulator: Emulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its device state could not come back (no room): its hooks' CUDA calls
    would block until the hook timeout, so they are not called."""
    emu = gpu_emulator
    monkeypatch.setattr(
        "timeshare.activities.backends.checkpointing.device_memory",
        lambda: nvml_device_memory(emu.env),
    )
    async with two_ranks(tmp_path, engine, emu) as (agent, ranks):
        await agent.admit("b", ["a"])
        free = nvml_device_memory(emu.env)["gpu0"].free_bytes
        filler = start_worker(emu.env, tmp_path, "filler", nbytes=free - (1 << 19))
        try:
            released = await agent.switches.release_job("g", "a")
        finally:
            filler.kill()
        assert released.checkpointed == sorted(ranks)
        assert engine.paths() == ["/sleep?level=1&mode=wait"] * 2
        assert "not called: its device state is still parked" in released.summary
