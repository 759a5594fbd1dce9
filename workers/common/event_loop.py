"""Which asyncio event loop a timeshare server process runs on.

The scheduler spends its CPU in the Temporal SDK's worker: each workflow
activation is a round of futures, callbacks and Rust-to-Python hand-offs on
the process's event loop. On uvloop (libuv, in C) the group workflow's
worker spent 8-11 % less CPU per hand-over than on asyncio's own loop, side
by side, and the scheduler under bench.scale 3-7 % less, back to back
(docs/benchmarks.md, "Scale"). The workflows
themselves run on the SDK's own deterministic loop either way: the choice
changes nothing they decide.

This module imports nothing of Temporal: the CLI reads its choices while
building the parser, which the light client builds too.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable

UVLOOP = "uvloop"
ASYNCIO = "asyncio"
EVENT_LOOPS = (UVLOOP, ASYNCIO)


def uvloop_installed() -> bool:
    return importlib.util.find_spec(UVLOOP) is not None


def default_event_loop() -> str:
    """uvloop where it is installed (the ``server`` extra installs it on
    Linux and macOS), asyncio's own loop elsewhere."""
    return UVLOOP if uvloop_installed() else ASYNCIO


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What ``asyncio.Runner`` makes its loop with; None for asyncio's own."""
    if name == ASYNCIO:
        return None
    import uvloop

    return uvloop.new_event_loop


def running_event_loop() -> str:
    """The name of the loop this coroutine runs on, for a ready line."""
    module = type(asyncio.get_running_loop()).__module__
    return UVLOOP if module.split(".")[0] == UVLOOP else ASYNCIO
