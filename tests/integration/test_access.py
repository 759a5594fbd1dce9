"""Who may do what: job tokens, scoped bearer tokens, TLS and mTLS, the
group limit, and the gateway's refusal to serve other hosts unprotected.

A bad tokens file: tests/unit/test_access.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

import timeshare.aio
from tests.conftest import SimNodes
from tests.gateways import RunningGateway, start_gateway
from tests.polling import wait_until_async
from timeshare import errors
from timeshare.testing import free_port, timeshare_command
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc
from timeshare.workers.common.service import StartupError
from timeshare.workers.common.temporal_settings import TemporalSettings
from timeshare.workers.gateway.access import GatewaySecurity, sha256_hex
from timeshare.workers.gateway.group_client import count_running_groups
from timeshare.workers.gateway.serve import GatewayOptions, serve_gateway

TEAM_TOKEN = "team-a-token-0123456789"


OPERATOR_TOKEN = "operator-token-0123456789"


@pytest.fixture(scope="module")
async def guarded_gateway(
    temporal_address: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningGateway]:
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.toml"
    tokens.write_text(
        f"""
[[tokens]]
name = "team-a"
token = "{TEAM_TOKEN}"
groups = ["team-a-*"]

[[tokens]]
name = "ops"
sha256 = "{sha256_hex(OPERATOR_TOKEN)}"
groups = ["*"]
operator = true
"""
    )
    running = await start_gateway(temporal_address, tokens_file=tokens)
    yield running
    await running.close()


def make_certificates(folder: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for localhost and a client certificate."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-subj", "/CN=timeshare-test-ca", "-days", "1")  # fmt: skip
    extensions = folder / "san.cnf"
    extensions.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "1",
            "-extfile", "san.cnf")  # fmt: skip
    return {name: folder / name for name in (
        "ca.pem", "server.pem", "server.key", "client.pem", "client.key")}  # fmt: skip


async def test_another_jobs_token_is_permission_denied(
    gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    node, group = f"n-{unique}", f"g-{unique}"
    await sim_nodes.start(node)
    api = timeshare.aio.connect(gateway)
    try:
        a = await api.join(group, "a", nodes=[node])
        b = await api.join(group, "b", nodes=[node])
        before = await api.get_group(group)
        async with grpc.aio.insecure_channel(gateway) as channel:
            stub = pb_grpc.TimeSlicerStub(channel)
            calls: list[Any] = [
                stub.Acquire(pb.AcquireRequest(group=group, job="a", job_token=b.ref.token)),
                stub.Heartbeat(pb.HeartbeatRequest(group=group, job="b", job_token=a.ref.token)),
                stub.Leave(pb.LeaveRequest(group=group, job="a", job_token=b.ref.token)),
                stub.Yield(pb.YieldRequest(group=group, job="b", job_token=a.ref.token, epoch=1)),
            ]
            for call in calls:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "belongs to job" in (refused.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as wrong:
                await stub.Acquire(pb.AcquireRequest(group=group, job="a", job_token="forged"))
            assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert await api.get_group(group) == before
    finally:
        await api.close()


async def test_bearer_tokens_are_scoped_to_groups(
    guarded_gateway: RunningGateway, sim_nodes: SimNodes, unique: str
) -> None:
    node, group = f"n-{unique}", f"team-a-{unique}"
    await sim_nodes.start(node)
    address = guarded_gateway.address
    nobody = timeshare.aio.connect(address)
    team = timeshare.aio.connect(address, token=TEAM_TOKEN)
    ops = timeshare.aio.connect(address, token=OPERATOR_TOKEN)
    stranger = timeshare.aio.connect(address, token="not-a-known-token-at-all")
    try:
        with pytest.raises(errors.Unauthenticated, match="TIMESHARE_TOKEN"):
            await nobody.join(group, "a", nodes=[node])
        with pytest.raises(errors.Unauthenticated):
            await stranger.get_group(group)
        job = await team.join(group, "a", nodes=[node])
        async with job.turn():
            pass
        with pytest.raises(errors.PermissionDenied, match="may not use group"):
            await team.join(f"other-{unique}", "a", nodes=[node])
        with pytest.raises(errors.PermissionDenied, match="operator"):
            await team.pause(group)
        with pytest.raises(errors.PermissionDenied, match="operator"):
            await team.drain(node)
        assert (await ops.pause(group)).paused
        assert not (await ops.pause(group, paused=False)).paused
        visible = [g.group for g in await team.list_groups()]
        assert all(g.startswith("team-a-") for g in visible)
        await job.leave()
    finally:
        for client in (nobody, team, ops, stranger):
            await client.close()


async def test_mutual_tls_admits_only_certified_clients(
    scheduler: Worker, temporal_address: str, tmp_path: Path
) -> None:
    files = make_certificates(tmp_path)
    port = free_port()
    security = GatewaySecurity(
        listen=f"127.0.0.1:{port}",
        tls_cert=files["server.pem"],
        tls_key=files["server.key"],
        tls_client_ca=files["ca.pem"],
    )
    stop = asyncio.Event()
    options = GatewayOptions(temporal=TemporalSettings(address=temporal_address), security=security)
    task = asyncio.create_task(serve_gateway(stop, options))
    address = f"localhost:{port}"
    certified = timeshare.aio.connect(
        address, tls_ca=files["ca.pem"], tls_cert=files["client.pem"], tls_key=files["client.key"]
    )
    anonymous = timeshare.aio.connect(address, tls_ca=files["ca.pem"])
    plain = timeshare.aio.connect(address)
    try:

        async def serving() -> bool:
            try:
                await certified.list_nodes()
            except errors.Unavailable:
                return False
            return True

        await wait_until_async(serving, "the TLS gateway to serve", every=0.1)
        for refused in (anonymous, plain):
            with pytest.raises(errors.Unavailable):
                await refused.list_nodes()
    finally:
        for api in (certified, anonymous, plain):
            await api.close()
        stop.set()
        await task


def test_other_hosts_need_tls_and_caller_checks(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="--tls-cert"):
        GatewaySecurity(listen="0.0.0.0:50051").check()
    with pytest.raises(StartupError, match="admits anyone"):
        GatewaySecurity(listen="0.0.0.0:50051", tls_cert=tmp_path, tls_key=tmp_path).check()
    GatewaySecurity(listen="[::1]:50051").check()
    GatewaySecurity(listen="0.0.0.0:50051", insecure=True).check()
    GatewaySecurity(
        listen="10.1.2.3:50051", tls_cert=tmp_path, tls_key=tmp_path, tokens_file=tmp_path
    ).check()
    # The refusal comes before any connection to Temporal: one line, exit 1.
    result = subprocess.run(
        [*timeshare_command("gateway", "--listen", "0.0.0.0:0", "--temporal", "127.0.0.1:1")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--tls-cert" in lines[0], result.stderr


async def test_the_group_limit_refuses_new_groups_only(
    client: Client, temporal_address: str, gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    node = f"n-{unique}"
    await sim_nodes.start(node)
    api = timeshare.aio.connect(gateway)
    await api.join(f"g-{unique}", "a", nodes=[node])

    async def counted() -> bool:  # visibility lags the new workflow
        return await count_running_groups(client) >= 1

    await wait_until_async(counted, "the group to be counted", every=0.1)
    limited = await start_gateway(temporal_address, max_groups=1)
    small = timeshare.aio.connect(limited.address)
    try:
        await small.join(f"g-{unique}", "b", nodes=[node])
        with pytest.raises(errors.TimeshareError) as refused:
            await small.join(f"new-{unique}", "a", nodes=[node])
        assert refused.value.code == "RESOURCE_EXHAUSTED"
        assert "--max-groups" in refused.value.message
    finally:
        await small.close()
        await api.close()
        await limited.close()


def test_cli_refuses_bad_temporal_settings_in_one_line(tmp_path: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text("x")
    config = tmp_path / "temporal.toml"
    config.write_text('[profile.default]\naddress = "no port"\nport = 7\n')
    cases = [
        ["scheduler", "--temporal-tls-key", str(key)],
        ["scheduler", "--temporal", "no port here"],
        ["agent", "--temporal-tls-ca", str(tmp_path / "missing.pem")],
        ["gateway", "--config", str(config)],
        ["gateway", "--temporal-api-key-file", str(tmp_path / "missing")],
    ]
    for args in cases:
        result = subprocess.run(
            [sys.executable, "-m", "timeshare", *args], capture_output=True, text=True, timeout=60
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1, (args, result.stderr)
        assert "Traceback" not in result.stderr
    config_result = subprocess.run(
        [sys.executable, "-m", "timeshare", "gateway", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # One line naming the bad field.
    assert "port" in config_result.stderr
