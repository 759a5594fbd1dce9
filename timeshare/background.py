"""Work that runs beside a block of code and ends with it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine


@contextlib.asynccontextmanager
async def background(work: Coroutine[None, None, None] | None) -> AsyncIterator[None]:
    """Run ``work`` (if any) while the block runs; cancelled at its end."""
    task = asyncio.create_task(work) if work is not None else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
