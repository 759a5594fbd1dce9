"""The processes' behaviour at the edges: one clear line and a non-zero exit
when they cannot start, and a client library free of temporalio.

Here the tests that start processes; the others are in
tests/unit/test_cli.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

from tests.conftest import REPO, wait_for_line
from timeshare.testing import free_port, timeshare_command


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        timeshare_command(*args), capture_output=True, text=True, cwd=REPO, timeout=timeout
    )


def assert_one_line_failure(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0]


def test_workers_say_when_temporal_is_unreachable() -> None:
    """Each waits for it (tests/integration/test_waiting_for_temporal.py), says
    so once, and after --temporal-wait ends with one line saying why."""
    closed = f"127.0.0.1:{free_port()}"
    for command in (["scheduler"], ["gateway", f"--listen=127.0.0.1:{free_port()}"], ["agent"]):
        result = run(*command, f"--temporal={closed}", "--temporal-wait=1")
        waiting, failure = result.stderr.strip().splitlines()
        assert "waiting for Temporal" in waiting and "--temporal-wait" in waiting
        assert result.returncode != 0
        for words in ("cannot reach Temporal", closed, "timeshare temporal", "waited"):
            assert words in failure, failure


def test_up_refuses_a_port_in_use(tmp_path: object) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("up", f"--listen=127.0.0.1:{port}", f"--port={free_port()}",
                     f"--ui-port={free_port()}", f"--data-dir={tmp_path}")  # fmt: skip
    assert_one_line_failure(result, f"port {port}", "in use")


def test_unknown_backend_names_the_known_ones() -> None:
    result = run("agent", "--backend=nope", f"--temporal=127.0.0.1:{free_port()}")
    assert_one_line_failure(result, "there is no backend 'nope'", "sim")
    assert result.returncode == 2  # refused while the command line is read


def test_bad_node_name_is_refused() -> None:
    result = run("agent", "--node=Not Valid")
    assert_one_line_failure(result, "--node", "invalid")


def test_status_without_a_gateway_says_what_to_do() -> None:
    result = run("status", f"--address=127.0.0.1:{free_port()}")
    assert_one_line_failure(result, "timeshare up")


def test_client_library_imports_no_temporalio() -> None:
    probe = (
        "import sys, timeshare, timeshare.aio, timeshare.synthetic, timeshare.status;"
        "import timeshare.testing;"
        "import timeshare.hooks, timeshare.hooks.vllm, timeshare.hooks.sglang;"
        "sys.exit(1 if any(m.startswith('temporalio') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", probe], cwd=REPO).returncode == 0


def test_ready_made_hooks_are_imported_only_when_used() -> None:
    probe = (
        "import sys, timeshare.hooks;"
        "sys.exit(1 if {'torch', 'timeshare.hooks.vllm', 'timeshare.hooks.torch_offload'}"
        " & set(sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", probe], cwd=REPO).returncode == 0


def test_llmd_compat_flags_are_checked() -> None:
    result = run("gateway", "--llmd-compat", "--llmd-compat-allow=not-a-network")
    assert_one_line_failure(result, "--llmd-compat-allow", "not-a-network")
    # Each bad value's wording: test_llmd_claims.py.
    result = run("gateway", "--llmd-compat", "--llmd-gpus", "s-*=node-0:0", "t-*=node-0:zero")
    assert_one_line_failure(result, "--llmd-gpus 't-*=node-0:zero'", "not a GPU index")
    assert_one_line_failure(run("gateway", "--llmd-gpus", "g=n:0"), "needs --llmd-compat")


def test_probe_says_in_one_line_when_there_is_no_gpu() -> None:
    result = run("agent", "--probe")
    if result.returncode == 0:  # a GPU host: one line per GPU
        assert result.stdout.strip() and "gpu0" in result.stdout
    else:
        assert_one_line_failure(result, "NVIDIA", "cuda backends")


def test_temporal_address_alone_points_every_process_at_temporal(temporal_address: str) -> None:
    """No flag: TEMPORAL_ADDRESS (Temporal's own variable) is enough for the
    scheduler, the gateway and the agent to reach the server and serve."""
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal_address}
    env.pop("TIMESHARE_TEMPORAL", None)
    # A short folder of its own: a socket's path must fit in 107 bytes, and
    # the agent keeps its registrations beside it.
    with tempfile.TemporaryDirectory(prefix="ts-env-") as agent_dir:
        commands = [
            ["scheduler"],
            ["gateway", f"--listen=127.0.0.1:{free_port()}"],
            ["agent", "--node=env-node", "--socket", f"{agent_dir}/agent.sock"],
        ]
        for command in commands:
            process = subprocess.Popen(
                timeshare_command(*command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, cwd=REPO, env=env,
            )  # fmt: skip
            try:
                lines = wait_for_line(process, ": ready:", timeout=60)
                assert temporal_address in lines[-1], lines
            finally:
                process.terminate()
                process.wait(30)


def test_the_scheduler_runs_activations_inline_on_uvloop_unless_told_otherwise(
    temporal_address: str,
) -> None:
    """Its ready line says which: the SDK's thread pool (with its 2 s
    deadlock detector) only with --deadlock-detection or in the sandbox;
    and its event loop: uvloop unless --event-loop asyncio."""
    said = {}
    for flags in ([], ["--deadlock-detection"], ["--workflow-sandbox"], ["--event-loop=asyncio"]):
        process = subprocess.Popen(
            timeshare_command("scheduler", f"--temporal={temporal_address}", *flags),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        )  # fmt: skip
        try:
            said[" ".join(flags)] = wait_for_line(process, ": ready:", timeout=60)[-1]
        finally:
            process.terminate()
            process.wait(30)
    assert "deadlock detection" not in said[""] and "sandbox" not in said[""], said
    assert "activations on threads with deadlock detection" in said["--deadlock-detection"]
    assert "sandbox" in said["--workflow-sandbox"], said
    # uvloop by default (the server extra installs it here), asyncio's own loop when told.
    assert said[""].rstrip().endswith("event loop uvloop"), said
    assert said["--event-loop=asyncio"].rstrip().endswith("event loop asyncio"), said
