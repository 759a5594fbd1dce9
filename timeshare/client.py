"""The blocking client. Use ``timeshare.connect()``; ``timeshare.aio`` is its asyncio twin."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import grpc

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
    """A connection to a timeshare gateway (or a node agent's socket)."""

    def __init__(self, address: str | None = None, transport: Transport | None = None) -> None:
        self.address = protocol.resolve_address(address)
        self._transport = transport or Transport.resolve()
        self._channel = self._transport.channel(self.address)
        self._stub = pb_grpc.TimeSlicerStub(self._channel)
        self._jobs: list[Job] = []

    def _call(self, method: Callable[..., Response], request: object, **kwargs: object) -> Response:
        try:
            with client_span(method, self._transport.metadata) as metadata:
                return method(request, metadata=metadata, **kwargs)
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.address) from None

    def _call_idempotent(self, method: Callable[..., Response], request: object) -> Response:
        for _ in range(protocol.IDEMPOTENT_ATTEMPTS - 1):
            try:
                return self._call(method, request)
            except Unavailable:
                time.sleep(protocol.RETRY_PAUSE_SECONDS)
        return self._call(method, request)

    def join(
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
        """Join ``group`` as ``job`` (defaults: TIMESHARE_GROUP, TIMESHARE_JOB); ``nodes``
        defaults to TIMESHARE_NODES, else the only node. ``policy`` applies if this join
        creates the group. ``weight`` scales the job's fair share of GPU time; a higher
        ``priority`` goes first; a ``backfill`` job gets the GPUs only while no regular
        job holds or waits for them, and is asked to yield (``should_yield``) as soon as
        one asks (docs/guide/backfill.md). The handle keeps the job's lease
        alive from a background thread until ``leave()`` or ``close()``.
        ``register=True`` also registers this process with the local agent: only for a
        process that both uses the GPU and asks for turns (see register_process)."""
        request = protocol.join_request(group, job, nodes, policy, weight, priority, backfill)
        handle = Job(self, protocol.job_ref(request, self._join(request)))
        self._jobs.append(handle)
        # Registrations of this process's job processes present this token.
        remember_job_token(handle.group, handle.name, handle.token)
        if register:
            # After the Join: the agent admits a process only with the job's token.
            try:
                register_process(request.group, request.job, token=handle.token)
            except TimeshareError:
                handle.leave()
                raise
        return handle

    def _join(self, request: pb.JoinRequest) -> pb.JoinResponse:
        report = RetryReport(request.job, "join", time.monotonic())
        while True:
            try:
                return self._call(self._stub.Join, request)
            except Unavailable as error:
                if not protocol.join_again(error, report.started, time.monotonic()):
                    raise
                report.failed(error, time.monotonic())
            time.sleep(protocol.RETRY_PAUSE_SECONDS)

    def group_history(self, group: str) -> GroupHistory:
        """The group's recent turns and switches, as `timeshare report` draws them."""
        request = pb.GetGroupHistoryRequest(group=protocol.valid("group", group))
        return protocol.group_history(self._call(self._stub.GetGroupHistory, request))

    def get_group(self, group: str) -> GroupStatus:
        request = pb.GetGroupRequest(group=protocol.valid("group", group))
        return protocol.group_status(self._call(self._stub.GetGroup, request))

    def list_groups(self) -> list[GroupStatus]:
        response = self._call(self._stub.ListGroups, pb.ListGroupsRequest())
        return [protocol.group_status(g) for g in response.groups]

    def list_nodes(self) -> list[NodeRecord]:
        response = self._call(self._stub.ListNodes, pb.ListNodesRequest())
        return [protocol.node_record(n) for n in response.nodes]

    def evict(self, group: str, job: str, reason: str = "") -> GroupStatus:
        request = protocol.evict_request(group, job, reason)
        return protocol.group_status(self._call(self._stub.Evict, request))

    def pause(self, group: str, paused: bool = True) -> GroupStatus:
        request = protocol.pause_request(group, paused)
        return protocol.group_status(self._call(self._stub.Pause, request))

    def drain(self, node: str, drained: bool = True) -> list[str]:
        """Drain (or with ``drained=False`` restore) a node; returns the groups told."""
        response = self._call(self._stub.Drain, protocol.drain_request(node, drained))
        return list(response.groups)

    def _forget(self, job: Job) -> None:
        if job in self._jobs:
            self._jobs.remove(job)

    def close(self) -> None:
        for job in list(self._jobs):
            with suppress(Exception):  # closing: nobody is left to tell
                job.finish_yield()
            job.stop_heartbeats()
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Job(protocol.JobIdentity):
    """One job's place in its group: acquire, yield, leave.

    A background thread renews the job's lease only when it must (see
    protocol.LeaseClock): every message renews it, so a job that takes turns
    sends nothing more. While the job holds a turn, a second thread listens to
    the turn's watch, which keeps ``Turn.should_yield`` current and calls the
    ``on_should_yield`` callbacks."""

    def __init__(self, client: Client, ref: protocol.JobRef) -> None:
        self._client = client
        self._stub = client._stub
        self.ref = ref
        self._lease = protocol.LeaseClock(ref.lease_seconds, ref.idle_lease_seconds, _now())
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._callbacks: list[Callable[[protocol.Turn], None]] = []
        self._watch: _TurnWatch | None = None
        # A yield_nowait() or next_turn_nowait() whose answer has not been
        # waited for yet.
        self._yielding: _BackgroundYield | None = None
        self._keeping: _BackgroundKeep | None = None
        # False once the gateway turned out to predate KeepTurn.
        self._keeps = True
        self._renewals = threading.Thread(
            target=self._renew, name=f"timeshare-lease-{ref.job}", daemon=True
        )
        self._renewals.start()

    def _send(self, method: Callable[..., Response], request: object, **kwargs: object) -> Response:
        response = self._client._call(method, request, **kwargs)
        self._lease.sent(_now())
        return response

    def _renew(self) -> None:
        while not self._stopped.is_set():
            wait = self._lease.due_in(_now())
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()
                continue
            try:
                beat = self._send(
                    self._stub.Heartbeat,
                    self.ref.heartbeat_request(),
                    timeout=self.ref.heartbeat_seconds,
                )
            except (Aborted, NotFound):
                return  # evicted or gone: the job's next call says why
            except (TimeshareError, ValueError):
                # A missed renewal (or a closing channel); the lease allows for some.
                self._stopped.wait(min(1.0, self.ref.heartbeat_seconds))
                continue
            watch = self._watch
            if watch is not None and beat.should_yield and not watch.turn.should_yield:
                self._asked(watch.turn)

    def stop_heartbeats(self) -> None:
        self._stopped.set()
        self._wake.set()
        self._end_watch()
        if self._renewals is not threading.current_thread():
            self._renewals.join(timeout=self.ref.heartbeat_seconds + 1)

    def on_should_yield(self, callback: Callable[[protocol.Turn], None]) -> None:
        """Call ``callback(turn)`` (from a background thread) when the group asks
        for the turn back. Keep it short: set a flag the training loop checks."""
        self._callbacks.append(callback)

    def _asked(self, turn: protocol.Turn) -> None:
        turn._yield_requested = True
        for callback in list(self._callbacks):
            callback(turn)

    def _noticed(self, turn: protocol.Turn, notice: pb.TurnNotice) -> None:
        asked, contended = protocol.apply_notice(turn, self._lease, notice)
        if contended:
            self._wake.set()  # renew now, then every third of the lease
        if asked:
            self._asked(turn)

    def acquire(self, timeout: float | None = None, phase: str = "") -> protocol.Turn:
        """Block until this job holds the group's GPUs; its state is back on its nodes.
        ``phase`` ("rollout", "train") names what the turn is for."""
        self._settle_pending()
        return self._ask(self.ref.acquire_request(timeout, phase), timeout)

    def next_turn(self, timeout: float | None = None, phase: str = "") -> protocol.Turn:
        """Give the turn back and ask for the next in one message (training
        done, sampling next): with nobody waiting the job keeps its GPUs and
        nothing moves, in one round trip instead of a yield and an acquire;
        with others waiting they go first, as after ``yield_()``."""
        self._settle_pending()
        request = self.ref.next_turn_request(timeout, phase)
        self._end_watch()
        try:
            return self._ask(request, timeout)
        except TimeshareError as error:
            if not isinstance(error, InvalidArgument):
                self.ref.yielded()  # given back (or no longer the job's to give)
            raise

    def next_turn_nowait(self, timeout: float | None = None, phase: str = "") -> protocol.Turn:
        """As ``next_turn``, without waiting where nobody waits: the job goes
        on into ``phase`` on the GPUs it holds at once, and the message that
        says so travels meanwhile; the same turn is returned, its phase set.
        Only where the turn's watch has last said that nobody waits (but
        backfill jobs, which never go before a regular job's next phase) and
        nobody asks for the turn back; otherwise this is ``next_turn``. If
        someone asked in the meantime, the group asks for the turn back
        (``should_yield``): give it back after this phase. The next call
        waits for the answer first and raises its failure, if any."""
        self._settle_pending()
        watch = self._watch
        turn = watch.turn if watch is not None else None
        if not (self._keeps and watch is not None and protocol.may_keep_turn(
                turn, self._lease, watch.heard)):  # fmt: skip
            return self.next_turn(timeout, phase)
        assert turn is not None
        self._keeping = _BackgroundKeep(self, turn, self.ref.keep_turn_request(phase))
        turn.phase = phase
        return turn

    def _ask(self, request: pb.AcquireRequest, timeout: float | None) -> protocol.Turn:
        deadline = protocol.AcquireDeadline(timeout, time.monotonic())
        report = RetryReport(self.name, "acquire", time.monotonic())
        self._lease.acquiring += 1
        try:
            while True:
                rpc_timeout = deadline.rpc_timeout(time.monotonic())
                try:
                    response = self._send(self._stub.Acquire, request, timeout=rpc_timeout)
                    break
                except Unavailable as error:
                    deadline.check_retry(self.name, time.monotonic())
                    report.failed(error, time.monotonic())
                    time.sleep(protocol.RETRY_PAUSE_SECONDS)
        finally:
            self._lease.acquiring -= 1
        turn = self.ref.granted(response)
        self._start_watch(turn)
        return turn

    def _start_watch(self, turn: protocol.Turn) -> None:
        self._end_watch()
        if not self._lease.legacy:
            self._watch = _TurnWatch(self, turn)
            self._watch.start()
        else:
            self._watch = _TurnWatch(self, turn, listen=False)

    def _end_watch(self) -> None:
        watch, self._watch = self._watch, None
        self._lease.contended = False
        if watch is not None:
            watch.stop()

    def yield_(self) -> float:
        """Give the GPUs back; returns the seconds this turn was held."""
        self._settle_pending()
        self._end_watch()
        try:
            response = self._client._call_idempotent(self._stub.Yield, self.ref.yield_request())
        except Aborted:
            self.ref.yielded()  # evicted: there is no turn left to give back
            raise
        self._lease.sent(_now())
        self.ref.yielded()
        return response.held_seconds

    release = yield_

    def yield_nowait(self) -> None:
        """Give the GPUs back without waiting for the scheduler's answer: the
        job's CPU work (rewards, data loading) starts while the yield travels,
        a round trip sooner. The job must stay off the GPUs from here on, as
        after ``yield_()``. Its next call (acquire, next_turn, yield, heartbeat)
        waits for the answer first and raises the yield's failure, if any:
        Aborted if the job was evicted meanwhile; any other, with the turn
        still the job's to give back. ``finish_yield()`` waits for it alone."""
        self._settle_pending()
        request = self.ref.yield_request()
        self._end_watch()
        self._yielding = _BackgroundYield(self, request)
        self.ref.yielded()

    def finish_yield(self) -> float | None:
        """Wait for the answer to a ``yield_nowait()``: the seconds the turn
        was held, or None when none was pending; raises its failure."""
        pending = self._yielding
        self._settle_pending()
        return None if pending is None else pending.held_seconds

    def _settle_pending(self) -> None:
        keeping, self._keeping = self._keeping, None
        if keeping is not None:
            keeping.wait()
            if keeping.unsupported:
                self._keeps = False  # an older gateway did nothing: the turn is as it was
            elif keeping.error is not None:
                raise keeping.error
            elif keeping.asked_to_yield and not keeping.turn.should_yield:
                self._asked(keeping.turn)
        pending, self._yielding = self._yielding, None
        if pending is None:
            return
        pending.wait()
        if pending.error is None:
            return
        if not isinstance(pending.error, Aborted):
            # The scheduler has not recorded it: the turn is still the job's.
            self.ref.epoch = pending.request.epoch
        raise pending.error

    @contextmanager
    def turn(self, timeout: float | None = None, phase: str = "") -> Iterator[protocol.Turn]:
        """``with job.turn(): trainer.step()`` — acquire, then always yield."""
        granted = self.acquire(timeout, phase)
        try:
            yield granted
        finally:
            self.yield_()

    def heartbeat(self) -> pb.HeartbeatResponse:
        self._settle_pending()
        return self._send(self._stub.Heartbeat, self.ref.heartbeat_request())

    def leave(self) -> None:
        # Leaving gives the turn back whatever became of a pending yield.
        with suppress(Exception):
            self._settle_pending()
        self.stop_heartbeats()
        self._client._call_idempotent(self._stub.Leave, self.ref.leave_request())
        self.ref.yielded()
        self._client._forget(self)


class _BackgroundYield:
    """One ``Job.yield_nowait()``: its Yield call, in a thread of its own."""

    def __init__(self, job: Job, request: pb.YieldRequest) -> None:
        self.job, self.request = job, request
        self.held_seconds: float | None = None
        self.error: Exception | None = None
        self._thread = threading.Thread(
            target=self._send, name=f"timeshare-yield-{job.name}", daemon=True
        )
        self._thread.start()

    def _send(self) -> None:
        job = self.job
        try:
            response = job._client._call_idempotent(job._stub.Yield, self.request)
        except Exception as error:  # raised in the job's own thread by its next call
            self.error = error
            return
        job._lease.sent(_now())
        self.held_seconds = response.held_seconds

    def wait(self) -> None:
        self._thread.join()


class _BackgroundKeep:
    """One ``Job.next_turn_nowait()`` that kept the turn: its KeepTurn call,
    in a thread of its own."""

    def __init__(self, job: Job, turn: protocol.Turn, request: pb.KeepTurnRequest) -> None:
        self.job, self.turn, self.request = job, turn, request
        self.asked_to_yield = False
        self.unsupported = False
        self.error: Exception | None = None
        self._thread = threading.Thread(
            target=self._send, name=f"timeshare-keep-{job.name}", daemon=True
        )
        self._thread.start()

    def _send(self) -> None:
        job = self.job
        try:
            response = job._client._call_idempotent(job._stub.KeepTurn, self.request)
        except Unimplemented:
            self.unsupported = True
            return
        except Exception as error:  # raised in the job's own thread by its next call
            self.error = error
            return
        job._lease.sent(_now())
        self.asked_to_yield = response.asked_to_yield

    def wait(self) -> None:
        self._thread.join()


class _TurnWatch:
    """Listens to one turn's watch stream in a thread of its own, opening it
    again if it breaks (a gateway restart) for as long as the turn is held."""

    def __init__(self, job: Job, turn: protocol.Turn, listen: bool = True) -> None:
        self.job, self.turn = job, turn
        # A notice has come: what the lease clock and the turn say is the
        # watch's, not only their defaults.
        self.heard = False
        self._done = threading.Event()
        self._call: grpc.RpcContext | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._listen, name=f"timeshare-watch-{job.name}", daemon=True
        )
        if not listen:
            self._done.set()

    def start(self) -> None:
        self._thread.start()

    def _listen(self) -> None:
        client = self.job._client
        request = self.job.ref.watch_request(self.turn)
        while not self._done.is_set():
            try:
                with client_span(self.job._stub.WatchTurn, client._transport.metadata) as metadata:
                    stream = self.job._stub.WatchTurn(request, metadata=metadata)
                    with self._lock:
                        if self._done.is_set():
                            stream.cancel()
                            return
                        self._call = stream
                    for notice in stream:
                        self.job._noticed(self.turn, notice)
                        self.heard = True
            except grpc.RpcError as error:
                if self._done.is_set() or error.code() == grpc.StatusCode.CANCELLED:
                    return
                if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                    # A gateway from before watches: heartbeat as it expects.
                    self.job._lease.idle_lease_seconds = 0.0
                    self.job._wake.set()
                    return
            self._done.wait(protocol.WATCH_RETRY_SECONDS)

    def stop(self) -> None:
        with self._lock:
            self._done.set()
            if self._call is not None:
                self._call.cancel()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def acquire_all(
    jobs: Sequence[Job], timeout: float | None = None, phase: str = ""
) -> AbstractContextManager[list[protocol.Turn]]:
    """Hold several groups at once (a weight sync between a trainer's and a
    sampler's pools): ``with timeshare.acquire_all([trainer, sampler]) as turns:``.
    Waits until it holds every job's turn, taking the groups in the one order
    every caller uses (by group name), so no two callers can deadlock however
    they list their jobs; gives the turns back in the reverse order. Turns are
    in the order of ``jobs``."""
    return _held_together(protocol.acquisition_order(jobs), list(jobs), timeout, phase)


@contextmanager
def _held_together(
    ordered: list[Job], given: list[Job], timeout: float | None, phase: str
) -> Iterator[list[protocol.Turn]]:
    deadline = None if timeout is None else time.monotonic() + timeout
    held: list[tuple[Job, protocol.Turn]] = []
    try:
        for job in ordered:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            held.append((job, job.acquire(left, phase)))
        turns = dict(held)
        yield [turns[job] for job in given]
    finally:
        for job, _ in reversed(held):
            job.yield_()


def _now() -> float:
    return time.monotonic()


def connect(
    address: str | None = None,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
) -> Client:
    """Connect to ``address``, else TIMESHARE_ADDRESS, else localhost:50051.
    ``token`` (else TIMESHARE_TOKEN) is the gateway's bearer token, if it asks for
    one; ``tls_ca`` (else TIMESHARE_TLS_CA) turns on TLS, ``tls_cert`` and
    ``tls_key`` add a client certificate."""
    return Client(address, Transport.resolve(token, tls_ca, tls_cert, tls_key))
