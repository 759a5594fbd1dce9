"""The asyncio twin of timeshare.client: the same calls, awaited."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import grpc
import grpc.aio

from timeshare import _protocol as protocol
from timeshare.credentials import remember_job_token
from timeshare.errors import (
    Aborted,
    InvalidArgument,
    NotFound,
    TimeshareError,
    Unavailable,
    Unimplemented,
    from_rpc_error,
)
from timeshare.history import GroupHistory
from timeshare.models import GroupPolicy, GroupStatus, NodeRecord
from timeshare.registration import register_process
from timeshare.retry_report import RetryReport
from timeshare.tracing import client_span
from timeshare.transport import Transport
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc

Response = TypeVar("Response")


class Client:
    def __init__(self, address: str | None = None, transport: Transport | None = None) -> None:
        self.address = protocol.resolve_address(address)
        self._transport = transport or Transport.resolve()
        self._channel = self._transport.aio_channel(self.address)
        self._stub = pb_grpc.TimeSlicerStub(self._channel)
        self._jobs: list[Job] = []

    async def _call(
        self, method: Callable[..., Awaitable[Response]], request: object, **kwargs: object
    ) -> Response:
        try:
            with client_span(method, self._transport.metadata) as metadata:
                return await method(request, metadata=metadata, **kwargs)
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.address) from None

    async def _call_idempotent(
        self, method: Callable[..., Awaitable[Response]], request: object
    ) -> Response:
        for _ in range(protocol.IDEMPOTENT_ATTEMPTS - 1):
            try:
                return await self._call(method, request)
            except Unavailable:
                await asyncio.sleep(protocol.RETRY_PAUSE_SECONDS)
        return await self._call(method, request)

    async def join(
        self,
        group: str | None = None,
        job: str | None = None,
        *,
        nodes: list[str] | None = None,
        policy: GroupPolicy | None = None,
        register: bool = False,
        weight: float = 1.0,
        priority: int = 0,
        backfill: bool = False,
    ) -> Job:
        request = protocol.join_request(group, job, nodes, policy, weight, priority, backfill)
        response = await self._join(request)
        handle = Job(self, protocol.job_ref(request, response))
        self._jobs.append(handle)
        remember_job_token(handle.group, handle.name, handle.token)
        if register:
            # After the Join: the agent admits a process only with the job's token.
            try:
                await asyncio.to_thread(
                    functools.partial(
                        register_process, request.group, request.job, token=handle.token
                    )
                )
            except TimeshareError:
                await handle.leave()
                raise
        return handle

    async def _join(self, request: pb.JoinRequest) -> pb.JoinResponse:
        clock = asyncio.get_running_loop().time
        report = RetryReport(request.job, "join", clock())
        while True:
            try:
                return await self._call(self._stub.Join, request)
            except Unavailable as error:
                if not protocol.join_again(error, report.started, clock()):
                    raise
                report.failed(error, clock())
            await asyncio.sleep(protocol.RETRY_PAUSE_SECONDS)

    async def group_history(self, group: str) -> GroupHistory:
        request = pb.GetGroupHistoryRequest(group=protocol.valid("group", group))
        return protocol.group_history(await self._call(self._stub.GetGroupHistory, request))

    async def get_group(self, group: str) -> GroupStatus:
        request = pb.GetGroupRequest(group=protocol.valid("group", group))
        return protocol.group_status(await self._call(self._stub.GetGroup, request))

    async def list_groups(self) -> list[GroupStatus]:
        response = await self._call(self._stub.ListGroups, pb.ListGroupsRequest())
        return [protocol.group_status(g) for g in response.groups]

    async def list_nodes(self) -> list[NodeRecord]:
        response = await self._call(self._stub.ListNodes, pb.ListNodesRequest())
        return [protocol.node_record(n) for n in response.nodes]

    async def evict(self, group: str, job: str, reason: str = "") -> GroupStatus:
        request = protocol.evict_request(group, job, reason)
        return protocol.group_status(await self._call(self._stub.Evict, request))

    async def pause(self, group: str, paused: bool = True) -> GroupStatus:
        request = protocol.pause_request(group, paused)
        return protocol.group_status(await self._call(self._stub.Pause, request))

    async def drain(self, node: str, drained: bool = True) -> list[str]:
        response = await self._call(self._stub.Drain, protocol.drain_request(node, drained))
        return list(response.groups)

    def _forget(self, job: Job) -> None:
        if job in self._jobs:
            self._jobs.remove(job)

    async def close(self) -> None:
        for job in list(self._jobs):
            with contextlib.suppress(Exception):  # closing: nobody is left to tell
                await job.finish_yield()
            await job.stop_heartbeats()
        await self._channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Job(protocol.JobIdentity):
    """One job's place in its group: acquire, yield, leave (awaited).

    As the blocking Job: a task renews the lease only when it must, and while
    a turn is held another task listens to its watch, keeping
    ``Turn.should_yield`` current and setting ``yield_requested``."""

    def __init__(self, client: Client, ref: protocol.JobRef) -> None:
        self._client = client
        self._stub = client._stub
        self.ref = ref
        loop = asyncio.get_running_loop()
        self._lease = protocol.LeaseClock(ref.lease_seconds, ref.idle_lease_seconds, loop.time())
        self._wake = asyncio.Event()
        # Set while the turn held is asked to yield; cleared at every acquire.
        self.yield_requested = asyncio.Event()
        self._turn: protocol.Turn | None = None
        self._watch: asyncio.Task[None] | None = None
        # A yield_nowait() whose answer has not been awaited yet, and its epoch.
        self._yielding: tuple[asyncio.Task[float], int] | None = None
        # A next_turn_nowait() that kept the turn, its answer not awaited yet.
        self._keeping: tuple[asyncio.Task[pb.KeepTurnResponse], protocol.Turn] | None = None
        # False once the gateway turned out to predate KeepTurn.
        self._keeps = True
        # The held turn's watch has said something (see protocol.may_keep_turn).
        self._heard = False
        self._heartbeats = loop.create_task(self._renew())

    async def _send(
        self, method: Callable[..., Awaitable[Response]], request: object, **kwargs: object
    ) -> Response:
        response = await self._client._call(method, request, **kwargs)
        self._lease.sent(asyncio.get_running_loop().time())
        return response

    async def _renew(self) -> None:
        clock = asyncio.get_running_loop().time
        while True:
            wait = self._lease.due_in(clock())
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                self._wake.clear()
                continue
            try:
                beat = await self._send(
                    self._stub.Heartbeat,
                    self.ref.heartbeat_request(),
                    timeout=self.ref.heartbeat_seconds,
                )
            except (Aborted, NotFound):
                return
            except TimeshareError:
                await asyncio.sleep(min(1.0, self.ref.heartbeat_seconds))
                continue
            if self._turn is not None and beat.should_yield and not self._turn.should_yield:
                self._asked(self._turn)

    async def stop_heartbeats(self) -> None:
        await self._end_watch()
        self._heartbeats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._heartbeats

    def _asked(self, turn: protocol.Turn) -> None:
        turn._yield_requested = True
        if turn is self._turn:
            self.yield_requested.set()

    async def _listen(self, turn: protocol.Turn) -> None:
        """The turn's watch, opened again if it breaks, until the turn ends."""
        request = self.ref.watch_request(turn)
        transport = self._client._transport
        while True:
            try:
                with client_span(self._stub.WatchTurn, transport.metadata) as metadata:
                    async for notice in self._stub.WatchTurn(request, metadata=metadata):
                        asked, contended = protocol.apply_notice(turn, self._lease, notice)
                        self._heard = True
                        if contended:
                            self._wake.set()
                        if asked:
                            self._asked(turn)
            except grpc.RpcError as error:
                code = error.code() if isinstance(error, grpc.aio.AioRpcError) else None
                if code == grpc.StatusCode.UNIMPLEMENTED:
                    self._lease.idle_lease_seconds = 0.0  # an older gateway: heartbeat
                    self._wake.set()
                    return
            await asyncio.sleep(protocol.WATCH_RETRY_SECONDS)

    async def _end_watch(self) -> None:
        watch, self._watch = self._watch, None
        self._lease.contended = False
        self._heard = False
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def acquire(self, timeout: float | None = None, phase: str = "") -> protocol.Turn:
        await self._settle_pending()
        return await self._ask(self.ref.acquire_request(timeout, phase), timeout)

    async def next_turn(self, timeout: float | None = None, phase: str = "") -> protocol.Turn:
        """Give the turn back and ask for the next in one message (see the
        blocking client's Job.next_turn)."""
        await self._settle_pending()
        request = self.ref.next_turn_request(timeout, phase)
        await self._end_watch()
        self._turn = None
        try:
            return await self._ask(request, timeout)
        except TimeshareError as error:
            if not isinstance(error, InvalidArgument):
                self.ref.yielded()
            raise

    async def next_turn_nowait(
        self, timeout: float | None = None, phase: str = ""
    ) -> protocol.Turn:
        """As ``next_turn``, without awaiting the answer where nobody waits
        (see the blocking client's Job.next_turn_nowait)."""
        await self._settle_pending()
        turn = self._turn
        if not (self._keeps and protocol.may_keep_turn(turn, self._lease, self._heard)):
            return await self.next_turn(timeout, phase)
        assert turn is not None
        request = self.ref.keep_turn_request(phase)
        task = asyncio.get_running_loop().create_task(self._keep(request))
        self._keeping = (task, turn)
        turn.phase = phase
        return turn

    async def _keep(self, request: pb.KeepTurnRequest) -> pb.KeepTurnResponse:
        response: pb.KeepTurnResponse = await self._client._call_idempotent(
            self._stub.KeepTurn, request
        )
        self._lease.sent(asyncio.get_running_loop().time())
        return response

    async def _ask(self, request: pb.AcquireRequest, timeout: float | None) -> protocol.Turn:
        clock = asyncio.get_running_loop().time
        deadline = protocol.AcquireDeadline(timeout, clock())
        report = RetryReport(self.name, "acquire", clock())
        self._lease.acquiring += 1
        try:
            while True:
                rpc_timeout = deadline.rpc_timeout(clock())
                try:
                    response = await self._send(self._stub.Acquire, request, timeout=rpc_timeout)
                    break
                except Unavailable as error:
                    deadline.check_retry(self.name, clock())
                    report.failed(error, clock())
                    await asyncio.sleep(protocol.RETRY_PAUSE_SECONDS)
        finally:
            self._lease.acquiring -= 1
        turn = self.ref.granted(response)
        await self._end_watch()
        self._turn = turn
        self.yield_requested.clear()
        if not self._lease.legacy:
            self._watch = asyncio.get_running_loop().create_task(self._listen(turn))
        return turn

    async def yield_(self) -> float:
        await self._settle_pending()
        await self._end_watch()
        self._turn = None
        try:
            held = await self._give_back(self.ref.yield_request())
        except Aborted:
            self.ref.yielded()
            raise
        self.ref.yielded()
        return held

    release = yield_

    async def _give_back(self, request: pb.YieldRequest) -> float:
        response = await self._client._call_idempotent(self._stub.Yield, request)
        self._lease.sent(asyncio.get_running_loop().time())
        return response.held_seconds

    async def yield_nowait(self) -> None:
        """Give the GPUs back without awaiting the scheduler's answer (see
        the blocking client's Job.yield_nowait): returns once the yield is on
        its way; the job's next call awaits the answer first and raises the
        yield's failure, if any."""
        await self._settle_pending()
        request = self.ref.yield_request()
        await self._end_watch()
        self._turn = None
        task = asyncio.get_running_loop().create_task(self._give_back(request))
        self._yielding = (task, request.epoch)
        self.ref.yielded()

    async def finish_yield(self) -> float | None:
        """Await the answer to a ``yield_nowait()``: the seconds the turn was
        held, or None when none was pending; raises its failure."""
        pending = self._yielding
        await self._settle_pending()
        return None if pending is None else pending[0].result()

    async def _settle_pending(self) -> None:
        keeping, self._keeping = self._keeping, None
        if keeping is not None:
            keep, turn = keeping
            try:
                kept = await keep
            except Unimplemented:
                self._keeps = False  # an older gateway did nothing: the turn is as it was
            else:
                if kept.asked_to_yield and not turn.should_yield:
                    self._asked(turn)
        pending, self._yielding = self._yielding, None
        if pending is None:
            return
        task, epoch = pending
        try:
            await task
        except Exception as error:
            if not isinstance(error, Aborted):
                # The scheduler has not recorded it: the turn is still the job's.
                self.ref.epoch = epoch
            raise

    @asynccontextmanager
    async def turn(
        self, timeout: float | None = None, phase: str = ""
    ) -> AsyncIterator[protocol.Turn]:
        granted = await self.acquire(timeout, phase)
        try:
            yield granted
        finally:
            await self.yield_()

    async def heartbeat(self) -> pb.HeartbeatResponse:
        await self._settle_pending()
        return await self._send(self._stub.Heartbeat, self.ref.heartbeat_request())

    async def leave(self) -> None:
        # Leaving gives the turn back whatever became of a pending yield.
        with contextlib.suppress(Exception):
            await self._settle_pending()
        await self.stop_heartbeats()
        await self._client._call_idempotent(self._stub.Leave, self.ref.leave_request())
        self.ref.yielded()
        self._client._forget(self)


def acquire_all(
    jobs: Sequence[Job], timeout: float | None = None, phase: str = ""
) -> AbstractAsyncContextManager[list[protocol.Turn]]:
    """The asyncio twin of ``timeshare.acquire_all``: all the jobs' turns, taken
    in the one order every caller uses, given back in reverse."""
    return _held_together(protocol.acquisition_order(jobs), list(jobs), timeout, phase)


@asynccontextmanager
async def _held_together(
    ordered: list[Job], given: list[Job], timeout: float | None, phase: str
) -> AsyncIterator[list[protocol.Turn]]:
    clock = asyncio.get_running_loop().time
    deadline = None if timeout is None else clock() + timeout
    held: list[tuple[Job, protocol.Turn]] = []
    try:
        for job in ordered:
            left = None if deadline is None else max(0.0, deadline - clock())
            held.append((job, await job.acquire(left, phase)))
        turns = dict(held)
        yield [turns[job] for job in given]
    finally:
        for job, _ in reversed(held):
            await job.yield_()


def connect(
    address: str | None = None,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
) -> Client:
    """The asyncio twin of ``timeshare.connect``."""
    return Client(address, Transport.resolve(token, tls_ca, tls_cert, tls_key))
