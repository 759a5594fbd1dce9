"""A TCP proxy on loopback between some parts of a stack and Temporal, which
bench chaos turns into a slow link (every chunk held back a while, each way,
in order) or a lossy one (every connection cut, and new ones cut as they
come) for a while. It runs on a thread of the bench's own, so the parts
behind it see a link and nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field

from timeshare.testing import free_port

CHUNK = 65536


@dataclass
class _Conditions:
    delay: float = 0.0
    cutting: bool = False
    # Every connection now open, cut at once when the link turns lossy.
    open: set[asyncio.StreamWriter] = field(default_factory=set)


class LinkProxy:
    def __init__(self, target_port: int, name: str) -> None:
        self.name = name
        self.port = free_port()
        self._target = target_port
        self._conditions = _Conditions()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"link {name}", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def slow(self, delay: float) -> None:
        """Hold every chunk back ``delay`` seconds, each way (0: pass at once)."""
        self._loop.call_soon_threadsafe(setattr, self._conditions, "delay", delay)

    def lossy(self, cutting: bool) -> None:
        """Cut every connection now and each new one as it comes (False: stop)."""
        self._loop.call_soon_threadsafe(self._set_cutting, cutting)

    def close(self) -> None:
        """Cut every connection, end every task, and stop."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        self._set_cutting(True)
        here = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not here]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _set_cutting(self, cutting: bool) -> None:
        self._conditions.cutting = cutting
        if cutting:
            for writer in list(self._conditions.open):
                writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.run_until_complete(server.wait_closed())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conditions = self._conditions
        if conditions.cutting:
            writer.close()
            return
        try:
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self._target)
        except OSError:
            writer.close()
            return
        conditions.open |= {writer, upstream}
        try:
            await asyncio.gather(
                self._pipe(reader, upstream), self._pipe(upstream_reader, writer),
                return_exceptions=True,
            )  # fmt: skip
        finally:
            conditions.open -= {writer, upstream}
            writer.close()
            upstream.close()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Read on, and write each chunk once its delay is over, in order."""
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def write() -> None:
            while True:
                read_at, chunk = await held.get()
                if not chunk:
                    return
                wait = read_at + self._conditions.delay - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                sink.write(chunk)
                await sink.drain()

        writer = asyncio.create_task(write())
        try:
            while chunk := await source.read(CHUNK):
                held.put_nowait((time.monotonic(), chunk))
        finally:
            held.put_nowait((time.monotonic(), b""))
            with contextlib.suppress(Exception):
                await writer
            sink.close()
