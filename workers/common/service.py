"""What every timeshare process shares: connecting to Temporal, a stop signal,
one clear line on a failed start, and an explicit exit."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NoReturn

from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.service import RetryConfig

from timeshare.workers.common.event_loop import ASYNCIO, loop_factory
from timeshare.workers.common.temporal_settings import TemporalSettings
from timeshare.workers.scheduler.data_converter import DATA_CONVERTER

if TYPE_CHECKING:
    from timeshare.workers.common.telemetry import Telemetry


class StartupError(Exception):
    """The process cannot start; the message says why and what to do."""


# The SDK's default backs off to 5 s between attempts: after Temporal comes
# back, the gateway's calls (every job's heartbeats and re-sent acquires)
# would stay away for up to 5 s more while every lease keeps running. Retry
# at least once a second instead. (Worker polls keep the SDK's own back-off.)
RETRY = RetryConfig(max_interval_millis=1000, max_retries=30)


async def connect_temporal(
    target: str | TemporalSettings,
    namespace: str = "default",
    telemetry: Telemetry | None = None,
    data_converter: DataConverter = DATA_CONVERTER,
) -> Client:
    """``data_converter``: timeshare's (workers/scheduler/data_converter.py) unless a
    benchmark's floor asks for the SDK's own."""
    settings = (
        target
        if isinstance(target, TemporalSettings)
        else TemporalSettings(address=target, namespace=namespace)
    )
    try:
        return await Client.connect(
            settings.address,
            namespace=settings.namespace,
            data_converter=data_converter,
            tls=settings.tls_config(),
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            interceptors=telemetry.interceptors if telemetry else [],
            runtime=telemetry.runtime if telemetry and telemetry.runtime else None,
            retry_config=RETRY,
            rpc_metadata=settings.rpc_metadata,
            grpc_compression=settings.grpc_compression(),
        )
    except Exception as error:
        raise StartupError(
            f"cannot reach Temporal at {settings.describe()}: {error}. "
            "Start it with `timeshare temporal` (or `timeshare up`), "
            "or point --temporal / TEMPORAL_ADDRESS at a running server"
        ) from None


def run_service(
    name: str, serve: Callable[[asyncio.Event], Awaitable[None]], event_loop: str = ASYNCIO
) -> NoReturn:
    """Run ``serve(stop)`` until it returns, on ``event_loop`` (one of
    timeshare.workers.common.event_loop.EVENT_LOOPS); SIGINT or SIGTERM sets ``stop``.

    The process ends with os._exit after flushing: the Temporal SDK's native
    threads can abort a normal interpreter shutdown after all work is done.
    """
    code = 0
    try:
        with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
            runner.run(_serve_until_stopped(serve))
    except StartupError as error:
        print(f"timeshare {name}: {error}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    except Exception as error:  # still one line, and still the explicit exit below
        print(f"timeshare {name}: unexpected {type(error).__name__}: {error}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def _serve_until_stopped(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await serve(stop)


def ready(name: str, message: str) -> None:
    print(f"timeshare {name}: ready: {message}", flush=True)
