"""One way to wait in tests: poll a condition until it holds or a generous bound
passes (a loaded 2-core machine can take seconds to start Python), then fail
with what was last seen. The bound is a safety net, never a timing assert."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
BOUND_SECONDS = 30.0
EVERY_SECONDS = 0.05


def wait_until(
    check: Callable[[], T | None],
    what: str,
    seconds: float = BOUND_SECONDS,
    every: float = EVERY_SECONDS,
) -> T:
    """The first truthy value of ``check()``."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g} s; last saw {value!r}")
        time.sleep(every)


async def wait_until_async(
    check: Callable[[], Awaitable[T | None]],
    what: str,
    seconds: float = BOUND_SECONDS,
    every: float = EVERY_SECONDS,
) -> T:
    """The first truthy value of ``await check()``; the event loop keeps serving."""
    deadline = time.monotonic() + seconds
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g} s; last saw {value!r}")
        await asyncio.sleep(every)


def async_check(check: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    """A plain check for ``wait_until_async``, where the test's loop must keep serving."""

    async def checked() -> T:
        return check()

    return checked
