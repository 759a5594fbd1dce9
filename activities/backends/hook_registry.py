"""The workload hooks registered on this node: one connection per process,
held open by the agent's socket (workers/agent/registration_socket.py), over which the
agent calls evict and admit (timeshare.hooks.protocol)."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict

from pydantic import ValidationError

from timeshare.activities.backends.base import BackendError
from timeshare.hooks.protocol import EvictMode, HookCall, HookName, HookReply

JobKey = tuple[str, str]  # (group, job)


class HookConnection:
    def __init__(
        self,
        group: str,
        job: str,
        pid: int,
        mode: EvictMode,
        evicted: bool,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.group, self.job, self.pid, self.mode = group, job, pid, mode
        # Where the process stands by the last hook it completed.
        self.evicted = evicted
        self.closed = False
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[HookReply]] = {}

    async def call(self, hook: HookName, mode: EvictMode | None, timeout: float) -> None:
        """Call one hook and wait for its answer; BackendError with the
        process's own message if it fails, hangs or hangs up."""
        what = f"job {self.group}/{self.job}: {hook}" + (f"({mode})" if mode else "()")
        what += f" hook of process {self.pid}"
        try:
            reply = await asyncio.wait_for(self._exchange(HookCall(
                id=next(self._ids), call=hook, mode=mode)), timeout)  # fmt: skip
        except TimeoutError:
            raise BackendError(f"{what} did not answer within {timeout:g} s") from None
        except (ConnectionError, BackendError) as error:
            raise BackendError(f"{what}: the process hung up ({error})") from None
        if not reply.ok:
            raise BackendError(f"{what} failed: {reply.error}")
        self.evicted = hook == "evict"

    async def _exchange(self, call: HookCall) -> HookReply:
        if self.closed:
            raise BackendError("its hook connection is closed")
        answer: asyncio.Future[HookReply] = asyncio.get_running_loop().create_future()
        self._pending[call.id] = answer
        try:
            self._writer.write(call.model_dump_json().encode() + b"\n")
            await self._writer.drain()
            return await answer
        finally:
            # A late answer to a call given up on is dropped when it comes.
            self._pending.pop(call.id, None)

    async def serve(self, reader: asyncio.StreamReader) -> None:
        """Route the process's answers to their calls until it goes away."""
        try:
            while line := await reader.readline():
                try:
                    reply = HookReply.model_validate_json(line)
                except ValidationError:
                    continue
                answer = self._pending.get(reply.id)
                if answer is not None and not answer.done():
                    answer.set_result(reply)
        except (ConnectionError, ValueError):
            pass  # gone, or a line over the limit: the connection ends either way
        finally:
            self.closed = True
            for answer in self._pending.values():
                if not answer.done():
                    answer.set_exception(BackendError("its hook connection closed"))

    def close(self) -> None:
        self.closed = True
        self._writer.close()


class HookRegistry:
    def __init__(self) -> None:
        # Set by a backend that calls hooks; otherwise the socket refuses them.
        self.accepting = False
        self._connections: defaultdict[JobKey, list[HookConnection]] = defaultdict(list)

    def add(self, connection: HookConnection) -> None:
        self._connections[(connection.group, connection.job)].append(connection)

    def remove(self, connection: HookConnection) -> None:
        key = (connection.group, connection.job)
        if connection in self._connections.get(key, []):
            self._connections[key].remove(connection)
            if not self._connections[key]:
                del self._connections[key]

    def jobs(self, group: str) -> list[str]:
        return sorted(job for (g, job) in self._connections if g == group)

    def connections(self, group: str, job: str) -> list[HookConnection]:
        return list(self._connections.get((group, job), []))

    def close_all(self) -> None:
        for connections in list(self._connections.values()):
            for connection in connections:
                connection.close()
