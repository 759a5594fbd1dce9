"""`timeshare temporal` says ready only once Temporal's frontend answers: its
port opens before the frontend is healthy, and a scheduler started in between
was refused ("Frontend is not healthy yet") and failed to start."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from timeshare.testing.ports import free_port
from timeshare.workers.common.children import spawn, stop_process
from timeshare.workers.common.service import StartupError
from timeshare.workers.temporal.dev_server import dev_server_command, wait_until_serving


class NotHealthyYet(grpc.GenericRpcHandler):
    """Answers every call as Temporal's frontend does while it starts."""

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler[Any, Any]:
        async def refuse(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Frontend is not healthy yet")
            return b""

        return grpc.unary_unary_rpc_method_handler(refuse)


@pytest.fixture
def running_process() -> Iterator[subprocess.Popen[bytes]]:
    """Stands for the dev server's process, alive throughout."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()


async def test_a_port_that_listens_but_is_not_healthy_is_not_ready(
    running_process: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([NotHealthyYet()])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with pytest.raises(StartupError, match="not healthy yet"):
            await wait_until_serving(port, running_process, tmp_path / "temporal.log", 2.0)
    finally:
        await server.stop(None)


async def test_a_port_the_server_draws_itself_and_finds_taken_is_named_as_in_use(
    tmp_path: Path,
) -> None:
    """The dev server draws its HTTP API port on its own; another stack
    starting at the same moment may take it first. The failure must say "in
    use", as the test stack's retry on other ports and a person reading one
    line both need, not only "exited with code 1"."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        port, ui_port = free_port(), free_port()
        command = [*dev_server_command(port, ui_port, tmp_path), "--http-port", str(taken)]
        log_path = tmp_path / "temporal.log"
        log_path.write_bytes(b"an earlier run's last words\nError: not this start's\n")
        offset = log_path.stat().st_size
        with log_path.open("ab") as log:
            process = spawn(command, stdout=log)
        try:
            with pytest.raises(StartupError) as failure:
                await wait_until_serving(port, process, log_path, 60.0, offset)
        finally:
            stop_process(process)
    # Most likely the held port; a drawn one taken meanwhile fails alike.
    assert "address already in use" in str(failure.value)
    assert "not this start's" not in str(failure.value)
