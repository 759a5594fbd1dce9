"""Gateways started in the test process, on loopback."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import grpc

from timeshare.testing import free_port
from timeshare.workers.common.telemetry import Telemetry
from timeshare.workers.common.temporal_settings import TemporalSettings
from timeshare.workers.gateway.access import GatewaySecurity
from timeshare.workers.gateway.llmd_compat import CompatSettings
from timeshare.workers.gateway.serve import GatewayOptions, serve_gateway


@dataclass
class RunningGateway:
    address: str
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def close(self) -> None:
        self.stop.set()
        await self.task


async def start_gateway(
    temporal_address: str,
    llmd_compat: CompatSettings | None = None,
    tokens_file: Path | None = None,
    max_groups: int = 1000,
    telemetry: Telemetry | None = None,
) -> RunningGateway:
    address = f"127.0.0.1:{free_port()}"
    options = GatewayOptions(
        temporal=TemporalSettings(address=temporal_address),
        security=GatewaySecurity(listen=address, tokens_file=tokens_file),
        llmd_compat=llmd_compat,
        max_groups=max_groups,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve_gateway(stop, options, telemetry))
    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
    return RunningGateway(address, stop, task)
