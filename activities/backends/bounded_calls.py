"""Calls a process backend makes on one process each (a driver call in a
thread of its pool, a run of the cuda-checkpoint utility): waited for at most
the call timeout, never abandoned while they may still change a process's
state, and never piled up behind one that hangs.

- A call that changes a process's state (lock, checkpoint, restore, unlock)
  and outlives the call timeout leaves that state unknown (StateUnknown); the
  next call on that process first waits for it to end.
- A read (the state, the restore thread) counts as in flight too: a read on a
  process whose identical read still runs waits for that one and shares its
  answer instead of starting another. A read that hangs in the driver then
  holds one thread, not one more per switch attempt.
- Calls still running past the call timeout are counted across processes;
  at ``stuck_limit`` no new call starts until some end, so hung calls cannot
  take every thread of the pool and starve the calls on healthy processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from timeshare.activities.backends.base import StateUnknown

Result = TypeVar("Result")
# What a call is, per process: "change" for anything that changes its state,
# or the kind of read ("state", "probe").
CallKind = str
CHANGE: CallKind = "change"


@dataclass
class _Call:
    future: asyncio.Future[Any]
    what: str
    started: float


class BoundedCalls:
    def __init__(self, timeout: float, stuck_limit: int) -> None:
        self.timeout = timeout
        self.stuck_limit = stuck_limit
        # The call of each kind under way on each process, while it runs.
        self._running: dict[tuple[int, CallKind], _Call] = {}
        # Calls that outlived the timeout and still run.
        self._stuck: dict[int, _Call] = {}

    async def change(self, start: Callable[[], Awaitable[Result]], what: str, pid: int) -> Result:
        """Run a call that may change the process's state, once every other
        call on that process has ended."""
        await self.ended(pid)
        return await self._run(start, what, pid, CHANGE)

    async def read(
        self, start: Callable[[], Awaitable[Result]], what: str, pid: int, kind: CallKind
    ) -> Result:
        """Run a read, or share the answer of the same read still running."""
        running = self._running.get((pid, kind))
        if running is not None and not running.future.done():
            result: Result = await self._wait(running, pid)
            return result
        return await self._run(start, what, pid, kind)

    async def ended(self, pid: int) -> None:
        """Wait (at most the timeout) until no call on the process runs."""
        for (other, _), call in list(self._running.items()):
            if other != pid or call.future.done():
                continue
            done, _ = await asyncio.wait({call.future}, timeout=self.timeout)
            if not done:
                raise StateUnknown(
                    f"an earlier call on process {pid} ({call.what}) is still running after "
                    f"{time.monotonic() - call.started:.0f} s; its state is unknown"
                )

    def stuck(self) -> list[str]:
        """The calls running past the timeout, oldest first, in words."""
        now = time.monotonic()
        calls = sorted(self._stuck.values(), key=lambda call: call.started)
        return [f"{call.what} ({now - call.started:.0f} s)" for call in calls]

    async def _run(
        self, start: Callable[[], Awaitable[Result]], what: str, pid: int, kind: CallKind
    ) -> Result:
        if len(self._stuck) >= self.stuck_limit:
            hung = self.stuck()
            raise StateUnknown(
                f"{len(hung)} calls have not returned past the call timeout "
                f"({self.timeout:g} s), the oldest {hung[0]}; no new call starts until they "
                f"end, so that they cannot take every thread ({what} was not started). "
                "Check the driver (nvidia-smi, dmesg); restarting the agent frees the threads"
            )
        call = _Call(asyncio.ensure_future(start()), what, time.monotonic())
        self._running[(pid, kind)] = call
        call.future.add_done_callback(partial(self._ended, (pid, kind), call))
        result: Result = await self._wait(call, pid)
        return result

    async def _wait(self, call: _Call, pid: int) -> Any:
        """The call's answer; it is shielded: a caller that gives up leaves it running."""
        done, _ = await asyncio.wait({call.future}, timeout=self.timeout)
        if not done:
            self._stuck[id(call)] = call
            raise StateUnknown(
                f"{call.what} has not returned after {self.timeout:g} s (--call-timeout); "
                f"the state of process {pid} is unknown until it does"
            )
        return call.future.result()

    def _ended(self, key: tuple[int, CallKind], call: _Call, future: asyncio.Future[Any]) -> None:
        if self._running.get(key) is call:
            del self._running[key]
        self._stuck.pop(id(call), None)
        if not future.cancelled():
            future.exception()  # retrieved: a late failure is read again from the state
