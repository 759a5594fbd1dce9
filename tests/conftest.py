"""Shared fixtures: a real Temporal dev server started from the installed
`temporal` binary (through `timeshare temporal`), a client, and in-process
scheduler and node-agent workers for workflow tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

import timeshare.aio
from tests import emulator
from tests.cuda_backends import running_workers
from tests.emulator.rig import CudaWorker, Emulator, emulator_in_this_process
from tests.gateways import start_gateway
from tests.needs import skip_what_the_machine_lacks
from timeshare.activities.backends.base import BackendConfig
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.backends.sim import SimBackend
from timeshare.activities.backends.sim_memory import sim_state_path
from timeshare.activities.switch import SwitchActivities
from timeshare.names import SCHEDULER_TASK_QUEUE, node_task_queue
from timeshare.testing import free_port, timeshare_command
from timeshare.workers.agent.serve import drop_claim
from timeshare.workers.common.service import connect_temporal
from timeshare.workflows.group import GroupWorkflow
from timeshare.workflows.registry import NodeRegistryWorkflow
from timeshare.workflows.sandbox import workflow_runner

REPO = Path(__file__).resolve().parent.parent


def wait_for_line(process: subprocess.Popen[str], needle: str, timeout: float) -> list[str]:
    """Read the process's output until a line contains ``needle``."""
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"process exited before {needle!r}: {lines}")
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"no {needle!r} within {timeout} s: {lines}")


def start_until_ready(
    command: Callable[[], list[str]],
    needle: str,
    timeout: float = 120,
    attempts: int = 3,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
) -> subprocess.Popen[str]:
    """Start a server process on fresh free ports until it reports ready.

    A port found free can be taken by someone else before the server binds it;
    a new attempt draws new ports instead of failing the whole session.
    """
    failures = []
    for _ in range(attempts):
        process = subprocess.Popen(
            command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env
        )
        try:
            wait_for_line(process, needle, timeout)
            return process
        except AssertionError as failure:
            failures.append(str(failure))
            process.kill()
            process.wait()
    raise AssertionError(f"{needle!r} never came: {failures}")


@dataclass(frozen=True)
class TemporalServer:
    address: str
    # Its Web UI (tests/integration/test_ui_details.py opens it in a browser).
    ui_url: str


@pytest.fixture(scope="session")
def temporal_address(temporal_server: TemporalServer) -> str:
    return temporal_server.address


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TemporalServer]:
    data_dir = tmp_path_factory.mktemp("temporal")
    ports: list[int] = []

    def command() -> list[str]:
        ports[:] = [free_port(), free_port()]
        return timeshare_command(
            "temporal", f"--port={ports[0]}", f"--ui-port={ports[1]}", f"--data-dir={data_dir}"
        )

    process = start_until_ready(command, "timeshare temporal: ready")
    try:
        yield TemporalServer(f"localhost:{ports[0]}", f"http://localhost:{ports[1]}")
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture(scope="session")
async def client(temporal_address: str) -> Client:
    return await connect_temporal(temporal_address, "default")


@pytest.fixture(scope="session")
async def scheduler(client: Client) -> AsyncIterator[Worker]:
    worker = Worker(
        client,
        task_queue=SCHEDULER_TASK_QUEUE,
        workflows=[GroupWorkflow, NodeRegistryWorkflow],
        workflow_runner=workflow_runner(),
    )
    async with worker:
        yield worker


class SimNodes:
    """In-process node agents with sim backends, one per node name. Like a
    real agent, one drops a job's GPU claim there once it has released it."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.backends: dict[str, SimBackend] = {}
        self.workers: dict[str, Worker] = {}

    async def start(
        self,
        node: str,
        state_bytes: int = 2**26,
        processes: ProcessTable | None = None,
        capacity_bytes: int | None = None,
        gpus: int = 1,
    ) -> SimBackend:
        config = BackendConfig(
            node=node,
            sim_state_bytes=state_bytes,
            sim_bandwidth_bytes_per_second=1e10,
            sim_capacity_bytes=capacity_bytes,
            sim_gpus=gpus,
        )
        backend = SimBackend(config)
        agent = SwitchActivities(node, backend, processes)
        agent.on_release.append(partial(drop_claim, self.client, node))
        worker = Worker(
            self.client,
            task_queue=node_task_queue(node),
            activities=[agent.switch, agent.release],
        )
        await worker.__aenter__()
        self.backends[node] = backend
        self.workers[node] = worker
        return backend

    async def stop_node(self, node: str) -> None:
        """The node's agent goes away (its GPU keeps what it held)."""
        await self.workers.pop(node).__aexit__(None, None, None)

    async def stop(self) -> None:
        for node in list(self.workers):
            await self.stop_node(node)


@pytest.fixture
async def sim_nodes(client: Client, scheduler: Worker) -> AsyncIterator[SimNodes]:
    nodes = SimNodes(client)
    yield nodes
    await nodes.stop()


@pytest.fixture(scope="session")
def gpu_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The GPU emulator, loaded into this test process once (it reads its
    configuration once per process) and shared by the tests that need it."""
    if emulator.gcc() is None:
        pytest.skip("gcc is not installed: the GPU emulator is built from C")
    with emulator_in_this_process(tmp_path_factory.mktemp("emulator")) as emu:
        yield emu


@pytest.fixture
def cuda_workers(gpu_emulator: Emulator) -> Iterator[list[CudaWorker]]:
    """Worker processes of the emulated CUDA driver, stopped after the test."""
    with running_workers(gpu_emulator) as started:
        yield started


@pytest.fixture(autouse=True)
def _emulator_log_of_this_test(request: pytest.FixtureRequest) -> None:
    """A test on the GPU emulator reads only its own part of the session's call
    log (process ids are reused within a session)."""
    if "gpu_emulator" in request.fixturenames:
        emulator.mark(request.getfixturevalue("gpu_emulator").log)


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:8]


# Test files that run for ten seconds or more (whole stacks, benchmarks, real
# trainers), roughly slowest first: run first, so that `make test`'s test
# processes (pytest-xdist, a file to a process) end together rather than one
# of them finishing a long file alone.
LONG_FILES = [
    "integration/test_faults.py",
    "integration/test_chaos.py",
    "integration/test_scale_bench.py",
    "integration/test_packaging.py",
    "integration/test_multigroup.py",
    "integration/test_gpu_check.py",
    "integration/test_multinode.py",
    "integration/test_end_to_end.py",
    "integration/test_short_runs.py",
    "integration/test_trl_grpo.py",
    "integration/test_emulator_end_to_end.py",
    "integration/test_policy_bench.py",
    "integration/test_grpo_toy.py",
    "integration/test_slime_integration.py",
    "integration/test_conformance.py",
    "integration/test_self_healing.py",
    "integration/test_turn_watch.py",
    "integration/test_exit_watch.py",
    "integration/test_access.py",
    "integration/test_checkpoint_backends.py",
    "integration/test_rpc_fuzz.py",
    "integration/test_tenants.py",
    "integration/test_replay.py",
    "integration/test_placement_live.py",
    "integration/test_agent_restart.py",
    "integration/test_replicas.py",
    "integration/test_observability.py",
    "integration/test_deploy_kubernetes.py",
    "integration/test_deploy_hosts.py",
    "integration/test_bundle.py",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_what_the_machine_lacks(items)
    rank = {name: index for index, name in enumerate(LONG_FILES)}
    tests = Path(__file__).parent
    items.sort(key=lambda item: rank.get(item.path.relative_to(tests).as_posix(), len(LONG_FILES)))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Every skip in one line: what was not run here, and why."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        _, _, reason = report.longrepr if isinstance(report.longrepr, tuple) else ("", 0, "?")
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        parts = "; ".join(f"{count} because {reason}" for reason, count in reasons.items())
        terminalreporter.write_line(f"skipped {sum(reasons.values())}: {parts}")


# The Temporal SDK's native threads can abort a normal interpreter shutdown
# (see shared/TEMPORAL-NOTES.md); end the test process explicitly instead,
# keeping pytest's exit status.
_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _exit_status and os.environ.get("TIMESHARE_TESTS_NORMAL_EXIT") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[0])


@pytest.fixture(scope="session")
async def gateway(temporal_address: str, scheduler: Worker) -> AsyncIterator[str]:
    running = await start_gateway(temporal_address)
    yield running.address
    await running.close()


@pytest.fixture
async def api(gateway: str) -> AsyncIterator[timeshare.aio.Client]:
    """The asyncio client, connected to the session's gateway."""
    client = timeshare.aio.connect(gateway)
    yield client
    await client.close()


def forget_simulated_gpus(data_dir: Path, node: str) -> None:
    """Remove what a test's `timeshare up` left in device memory (/dev/shm),
    which, like a GPU's, outlives the stack until the machine restarts."""
    held = sim_state_path(data_dir, node)
    if held.parent != data_dir:
        shutil.rmtree(held.parent, ignore_errors=True)
