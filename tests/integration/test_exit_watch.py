"""A job killed with SIGKILL runs no exit hook; its node's agent sees its
registered processes gone and evicts it, so the other jobs get the GPU at
once, not when the killed job's lease runs out (ten minutes here).

First the agent's watch on its own (a real process table and real processes,
the eviction recorded), then each framework's plug-in killed against a real
stack: gateway, scheduler and an agent process with a sim backend."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import timeshare
from tests.conftest import REPO, wait_for_line
from tests.polling import wait_until
from tests.processes import detached, kill
from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.loading import load_backend
from timeshare.activities.backends.processes import ProcessTable, alive
from timeshare.activities.switch import SwitchActivities
from timeshare.models import GroupPolicy
from timeshare.testing import LocalStack
from timeshare.workers.agent.exit_watch import EVICT_TRIES, ExitWatch

LEASE_SECONDS = 600.0
FRAMEWORKS = ["trl", "verl", "slime", "openrlhf", "skyrl"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Evictions:
    """Records each eviction asked for; ``fail`` of them raise first."""

    def __init__(self, fail: int = 0) -> None:
        self.asked: list[tuple[str, str, str]] = []
        self.fail = fail

    async def __call__(self, group: str, job: str, reason: str) -> bool:
        self.asked.append((group, job, reason))
        if self.fail:
            self.fail -= 1
            raise ConnectionError("Temporal is not reachable")
        return True


def sleeper() -> int:
    return detached(sys.executable, "-c", "import time; time.sleep(60)")


def killed(pid: int) -> None:
    kill(pid)
    wait_until(lambda: not alive(pid), f"process {pid} to exit")


@pytest.fixture
def pids() -> Iterator[list[int]]:
    started: list[int] = []
    yield started
    for pid in started:
        kill(pid)


def watch_of(
    table: ProcessTable, evictions: Evictions, clock: Clock, agent: SwitchActivities | None = None
) -> ExitWatch:
    if agent is None:
        return ExitWatch("node-a", table, evictions, grace_seconds=2.0, clock=clock)
    member = agent.processes_exited
    return ExitWatch("node-a", table, evictions, member, grace_seconds=2.0, clock=clock)


def agent_of(table: ProcessTable, record: Path | None = None) -> SwitchActivities:
    backend = load_backend("sim", BackendConfig(node="node-a"))
    return SwitchActivities("node-a", backend, table, record)


async def test_a_job_whose_processes_all_exit_is_evicted_once_after_the_grace(
    pids: list[int],
) -> None:
    table, evictions, clock = ProcessTable(), Evictions(), Clock()
    watch = watch_of(table, evictions, clock)
    pids += [sleeper(), sleeper(), sleeper()]
    table.register("g", "a", pids[0])
    table.register("g", "a", pids[1])
    table.register("g", "b", pids[2])
    killed(pids[0])
    assert await watch.check() == []  # one of a's processes lives on
    killed(pids[1])
    assert await watch.check() == [] and evictions.asked == []  # within the grace
    clock.now = 2.0
    assert await watch.check() == [("g", "a")]
    assert evictions.asked == [("g", "a", "all of its processes on node node-a exited")]
    clock.now = 10.0
    assert await watch.check() == [] and len(evictions.asked) == 1  # b lives; a told once


async def test_a_job_that_registers_again_within_the_grace_keeps_its_place(
    pids: list[int],
) -> None:
    table, evictions, clock = ProcessTable(), Evictions(), Clock()
    watch = watch_of(table, evictions, clock)
    pids += [sleeper(), sleeper()]
    table.register("g", "a", pids[0])
    killed(pids[0])
    await watch.check()
    table.register("g", "a", pids[1])  # the worker restarted
    clock.now = 5.0
    assert await watch.check() == [] and evictions.asked == []


async def test_a_released_job_is_not_evicted(pids: list[int]) -> None:
    table, evictions, clock = ProcessTable(), Evictions(), Clock()
    agent = agent_of(table)
    watch = watch_of(table, evictions, clock, agent)
    pids.append(sleeper())
    table.register("g", "a", pids[0])
    await agent.release_job("g", "a")  # it left its group
    killed(pids[0])
    clock.now = 5.0
    await watch.check()
    clock.now = 10.0
    assert await watch.check() == [] and evictions.asked == []


async def test_a_failing_eviction_is_retried_then_given_up_with_a_message(
    pids: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    table, clock = ProcessTable(), Clock()
    evictions = Evictions(fail=EVICT_TRIES)
    watch = watch_of(table, evictions, clock)
    pids.append(sleeper())
    table.register("g", "a", pids[0])
    killed(pids[0])
    await watch.check()
    clock.now = 2.0
    with caplog.at_level(logging.WARNING, logger="timeshare.agent"):
        for _ in range(EVICT_TRIES + 3):
            await watch.check()
    assert len(evictions.asked) == EVICT_TRIES  # then no more
    assert "run `timeshare evict g a`" in caplog.text

    # One that fails a few times and then goes through is evicted.
    evictions.fail, evictions.asked = 2, []
    pids.append(sleeper())
    table.register("g", "b", pids[1])
    killed(pids[1])
    await watch.check()
    clock.now = 4.0
    assert [await watch.check() for _ in range(3)] == [[], [], [("g", "b")]]


async def test_a_job_that_died_while_no_agent_ran_is_evicted_by_the_next(
    pids: list[int], tmp_path: Path
) -> None:
    path, record = tmp_path / "agent.registrations.json", tmp_path / "agent.node.json"
    pids += [sleeper(), sleeper(), sleeper()]
    before = ProcessTable(path)
    for job, pid in zip("abc", pids, strict=True):
        before.register("g", job, pid)
    await agent_of(before, record).release_job("g", "c")
    killed(pids[0])  # the agent is down
    killed(pids[2])
    evictions, clock = Evictions(), Clock()
    after = ProcessTable(path)
    watch = watch_of(after, evictions, clock, agent_of(after, record))
    await watch.check()
    clock.now = 2.0
    assert await watch.check() == [("g", "a")]  # not b (alive), not c (released)


# -- against a real stack --------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(tmp_path_factory.mktemp("exit-watch")) as local:
        yield local


def job_environment(stack: LocalStack, framework: str, group: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TIMESHARE_ADDRESS": stack.address,
           "TIMESHARE_NODES": stack.node, "TIMESHARE_JOB": "job-a",
           "TIMESHARE_AGENT_SOCKET": str(stack.socket_path)}  # fmt: skip
    for variable in ("TIMESHARE_TURNS_FD", "TIMESHARE_GROUP"):
        env.pop(variable, None)
    if framework == "slime":
        env.update(TIMESHARE_TRAINER_GROUP=group, TIMESHARE_SAMPLER_GROUP=group)
    else:
        env["TIMESHARE_GROUP"] = group
    return env


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_killed_job_is_evicted_and_the_waiting_job_gets_the_gpu(
    stack: LocalStack, framework: str
) -> None:
    group = f"killed-{framework}"
    policy = GroupPolicy(lease_seconds=LEASE_SECONDS, idle_lease_seconds=LEASE_SECONDS)
    with timeshare.connect(stack.address) as client:
        other = client.join(group, "job-b", nodes=[stack.node], policy=policy)
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.exiting_job", framework, "registered"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
            env=job_environment(stack, framework, group),
        )  # fmt: skip
        try:
            wait_for_line(process, "holding", 120)
            assert client.get_group(group).holder == "job-a"
            since = time.monotonic()
            process.send_signal(signal.SIGKILL)  # no exit hook runs
            other.acquire(timeout=120)  # the GPU comes back long before the lease ends
            took = time.monotonic() - since
        finally:
            process.kill()
            process.wait()
        status = client.get_group(group)
        assert status.holder == "job-b" and [job.job for job in status.jobs] == ["job-b"]
        assert status.evictions == 1  # evicted, not left: no exit hook ran
        other.leave()
    print(f"{framework} SIGKILL: job-b got the GPU {took:.2f} s after, lease {LEASE_SECONDS:.0f} s")
