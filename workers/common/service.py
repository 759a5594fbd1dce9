"""What every timeshare process shares: connecting to Temporal, a stop signal,
one clear line on a failed start, and an explicit exit."""

from __future__ import annotations

import asyncio
import contextlib
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


# Between attempts to reach a Temporal that is starting or restarting: the
# first soon, then less often.
WAIT_FIRST_PAUSE_SECONDS = 0.25
WAIT_LONGEST_PAUSE_SECONDS = 5.0


async def wait_for_temporal(
    settings: TemporalSettings,
    name: str,
    stop: asyncio.Event,
    telemetry: Telemetry | None = None,
) -> Client:
    """Connect, and while Temporal cannot be reached (not started yet, or
    restarting) try again with back-off, saying on stderr why each time the
    reason changes, for up to ``settings.wait_seconds`` (0: for ever). A
    service says it is ready only after this returns. Raises StartupError
    once the wait is over, or when ``stop`` is set meanwhile."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    pause = WAIT_FIRST_PAUSE_SECONDS
    said = ""
    while True:
        try:
            client = await connect_temporal(settings, telemetry=telemetry)
        except StartupError as error:
            cause = str(error).split(". Start it with", 1)[0]
            waited = loop.time() - started
            patience = settings.wait_seconds
            if patience and waited + pause > patience:
                raise StartupError(f"{error} (waited {waited:.0f} s for it)") from None
            if cause != said:
                limit = f"up to {patience:g} s" if patience else "for as long as it takes"
                print(
                    f"timeshare {name}: waiting for Temporal ({cause}); trying again "
                    f"every {WAIT_LONGEST_PAUSE_SECONDS:g} s at most, {limit} "
                    "(--temporal-wait)",
                    file=sys.stderr,
                    flush=True,
                )
                said = cause
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
            if stop.is_set():
                raise StartupError("stopped while waiting for Temporal") from None
            pause = min(WAIT_LONGEST_PAUSE_SECONDS, pause * 2)
            continue
        if said:
            print(f"timeshare {name}: Temporal answers now", file=sys.stderr, flush=True)
        return client


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
