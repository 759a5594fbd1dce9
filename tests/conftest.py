"""Shared fixtures: a real Temporal dev server started from the installed
`temporal` binary (through `timeshare temporal`), a client, and in-process
scheduler and node-agent workers for workflow tests."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
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
from tests.cuda_backends import running_workers
from tests.gateways import start_gateway
from tests.needs import skip_what_the_machine_lacks
from tests.service_loop import ServiceLoop
from timeshare.activities.backends.base import Backend, BackendConfig
from timeshare.activities.backends.processes import ProcessTable
from timeshare.activities.backends.sim import SimBackend
from timeshare.activities.backends.sim_memory import sim_state_path
from timeshare.activities.switch import SwitchActivities
from timeshare.gpu_check import emulator
from timeshare.gpu_check.emulator.rig import CudaWorker, Emulator, emulator_in_this_process
from timeshare.names import SCHEDULER_TASK_QUEUE, node_task_queue
from timeshare.testing import free_port, timeshare_command
from timeshare.workers.agent.serve import drop_claim
from timeshare.workers.common.service import connect_temporal
from timeshare.workflows.group import GroupWorkflow
from timeshare.workflows.registry import NodeRegistryWorkflow
from timeshare.workflows.sandbox import workflow_runner

REPO = Path(__file__).resolve().parent.parent
# A runtime folder of this test process's own: `timeshare up` serves its
# agent's socket there by default (timeshare.agent_socket), and the stacks of
# test processes running side by side must not meet there. Children inherit it.
RUNTIME_DIR = tempfile.mkdtemp(prefix="timeshare-test-runtime-")
os.environ["XDG_RUNTIME_DIR"] = RUNTIME_DIR
os.environ.pop("TIMESHARE_AGENT_SOCKET", None)
atexit.register(shutil.rmtree, RUNTIME_DIR, True)


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
def service_loop() -> Iterator[ServiceLoop]:
    """Where the scheduler, the session's gateway and the sim agents run: not
    pytest's loop, which a synchronous test blocks (tests/service_loop.py)."""
    running = ServiceLoop()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def service_client(temporal_address: str, service_loop: ServiceLoop) -> Client:
    """A Temporal client of the service loop, for the workers running there."""
    return service_loop.run(connect_temporal(temporal_address, "default"))


@pytest.fixture(scope="session")
def scheduler(service_client: Client, service_loop: ServiceLoop) -> Iterator[Worker]:
    async def started() -> Worker:
        worker = Worker(
            service_client,
            task_queue=SCHEDULER_TASK_QUEUE,
            workflows=[GroupWorkflow, NodeRegistryWorkflow],
            workflow_runner=workflow_runner(),
        )
        await worker.__aenter__()
        return worker

    worker = service_loop.run(started())
    yield worker
    service_loop.run(worker.__aexit__(None, None, None))


class SimNodes:
    """In-process node agents with sim backends, one per node name. Like a
    real agent, one drops a job's GPU claim there once it has released it."""

    def __init__(self, client: Client, service_loop: ServiceLoop) -> None:
        # The service loop's client: the agents run there.
        self.client = client
        self.service_loop = service_loop
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
        return await self.service_loop.call(
            self._start(node, state_bytes, processes, capacity_bytes, gpus)
        )

    async def _start(
        self,
        node: str,
        state_bytes: int,
        processes: ProcessTable | None,
        capacity_bytes: int | None,
        gpus: int,
    ) -> SimBackend:
        config = BackendConfig(
            node=node,
            sim_state_bytes=state_bytes,
            sim_bandwidth_bytes_per_second=1e10,
            sim_capacity_bytes=capacity_bytes,
            sim_gpus=gpus,
        )
        backend = SimBackend(config)
        await self._serve(node, backend, processes)
        self.backends[node] = backend
        return backend

    async def start_backend(self, node: str, backend: Backend) -> None:
        """A node whose agent runs another backend (the app backend: hooks alone)."""
        await self.service_loop.call(self._serve(node, backend, None))

    async def _serve(self, node: str, backend: Backend, processes: ProcessTable | None) -> None:
        agent = SwitchActivities(node, backend, processes)
        agent.on_release.append(partial(drop_claim, self.client, node))
        worker = Worker(
            self.client,
            task_queue=node_task_queue(node),
            activities=[agent.switch, agent.release],
        )
        await worker.__aenter__()
        self.workers[node] = worker

    async def stop_node(self, node: str) -> None:
        """The node's agent goes away (its GPU keeps what it held)."""
        await self.service_loop.call(self.workers.pop(node).__aexit__(None, None, None))

    async def stop(self) -> None:
        for node in list(self.workers):
            await self.stop_node(node)


@pytest.fixture
async def sim_nodes(
    service_client: Client, service_loop: ServiceLoop, scheduler: Worker
) -> AsyncIterator[SimNodes]:
    nodes = SimNodes(service_client, service_loop)
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


# Each test file's seconds in the last run on this machine (pytest's cache,
# written by the process that reports results): the longest files are run first,
# so that `make test`'s test processes (pytest-xdist, a file to a process) end
# together rather than one of them finishing a long file alone. Without a record
# (a new clone) the files run in collection order; a file new since then runs first.
FILE_SECONDS = "timeshare/file_seconds"
_file_seconds: dict[str, float] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_what_the_machine_lacks(items)
    cache = getattr(config, "cache", None)
    measured: dict[str, float] = cache.get(FILE_SECONDS, {}) if cache is not None else {}
    if not measured:
        return
    longest = max(measured.values())
    tests = Path(__file__).parent
    items.sort(key=lambda item: -measured.get(item.path.relative_to(tests).as_posix(), longest + 1))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    name = report.nodeid.split("::", 1)[0].removeprefix("tests/")
    _file_seconds[name] = _file_seconds.get(name, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))
    cache = getattr(session.config, "cache", None)
    # The process that saw every file's reports: the only one under pytest-xdist.
    if cache is not None and not hasattr(session.config, "workerinput") and _file_seconds:
        recorded: dict[str, float] = cache.get(FILE_SECONDS, {})
        recorded.update({name: round(seconds, 1) for name, seconds in _file_seconds.items()})
        cache.set(FILE_SECONDS, recorded)


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
# (docs/facts.md, "Process exit"); end the test process explicitly instead,
# keeping pytest's exit status.
_exit_status: list[int] = []


def pytest_unconfigure(config: pytest.Config) -> None:
    if _exit_status and os.environ.get("TIMESHARE_TESTS_NORMAL_EXIT") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[0])


@pytest.fixture(scope="session")
def gateway(temporal_address: str, scheduler: Worker, service_loop: ServiceLoop) -> Iterator[str]:
    running = service_loop.run(start_gateway(temporal_address))
    yield running.address
    service_loop.run(running.close())


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
