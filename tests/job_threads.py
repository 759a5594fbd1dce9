"""Jobs of an integration test, each a blocking client in a thread of its own,
started together; a failure in any thread fails the test."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

JOB_SECONDS = 120.0


async def run_jobs_together(job: Callable[[str], None], names: Sequence[str]) -> None:
    """Run ``job(name)`` for every name, each in a thread, released at once."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(names))

    def run(name: str) -> None:
        try:
            start.wait()
            job(name)
        except BaseException as error:  # reported by the test
            errors.append(error)

    def scenario() -> None:
        threads = [threading.Thread(target=run, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOB_SECONDS)
        assert not errors, errors

    await asyncio.to_thread(scenario)
