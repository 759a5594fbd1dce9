"""The event loop the suite's shared services run on: the scheduler worker,
the session's gateway and the sim node agents. It runs in a thread of its own,
so a test that blocks pytest's event loop (a synchronous test, a long
`subprocess.run`) cannot pause them: they go on serving the other tests'
groups as a real deployment's processes would, and product timeouts need no
slack for a paused scheduler."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class ServiceLoop:
    """An asyncio loop in a daemon thread; coroutines are handed to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="test-services", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the service loop; await it from any other loop."""
        return await asyncio.wrap_future(self.submit(coroutine))

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        """Run ``coroutine`` on the service loop and wait for it (from a thread)."""
        return self.submit(coroutine).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
