"""What a job's client makes of a failed call: an error naming its cause, and
a Join sent again while the gateway says its Temporal or scheduler did not
answer (as an acquire is), never where no gateway answers at all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import grpc
import pytest
from temporalio.client import Client

import timeshare
import timeshare.aio
from timeshare import _protocol as protocol
from timeshare.errors import DeadlineExceeded, Unavailable, from_rpc_error
from timeshare.retry_report import RetryReport
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc
from timeshare.workers.gateway.serve import TimeSlicerService

Context = grpc.aio.ServicerContext[Any, Any]

GATEWAY_TIMEOUT = (
    "the scheduler did not answer within 30 s: check that `timeshare scheduler` is running"
)
NO_CONNECTION = "failed to connect to all addresses; last error: UNKNOWN: Connection refused"


class Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_the_gateway_saying_its_scheduler_did_not_answer_is_told_apart() -> None:
    answered = from_rpc_error(Failed(grpc.StatusCode.UNAVAILABLE, GATEWAY_TIMEOUT), "gw:1")
    assert isinstance(answered, Unavailable) and answered.from_gateway
    assert answered.message == GATEWAY_TIMEOUT
    nobody = from_rpc_error(Failed(grpc.StatusCode.UNAVAILABLE, NO_CONNECTION), "gw:1")
    assert isinstance(nobody, Unavailable) and not nobody.from_gateway
    assert "no timeshare gateway answers at gw:1" in nobody.message


def test_a_call_past_its_own_deadline_names_the_gateway_that_did_not_answer() -> None:
    late = from_rpc_error(Failed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), "gw:1")
    assert isinstance(late, DeadlineExceeded)
    assert "no answer from the gateway at gw:1" in late.message
    told = "job 'a' was not granted within its timeout"
    refused = from_rpc_error(Failed(grpc.StatusCode.DEADLINE_EXCEEDED, told), "gw:1")
    assert refused.message == told


@pytest.mark.parametrize(
    ("error", "elapsed", "again"),
    [
        (Unavailable(GATEWAY_TIMEOUT, from_gateway=True), 1.0, True),
        (Unavailable(GATEWAY_TIMEOUT, from_gateway=True), protocol.JOIN_RETRY_SECONDS, False),
        (Unavailable("no timeshare gateway answers at gw:1"), 1.0, False),
        (DeadlineExceeded("no answer"), 1.0, False),
    ],
)
def test_a_join_is_sent_again_only_while_the_gateway_waits_for_its_scheduler(
    error: Unavailable | DeadlineExceeded, elapsed: float, again: bool
) -> None:
    assert protocol.join_again(error, 100.0, 100.0 + elapsed) is again


class WaitingGateway(TimeSlicerService):
    """A gateway whose scheduler does not answer the first ``refusals`` Joins."""

    def __init__(self, refusals: int) -> None:
        super().__init__(cast(Client, None))
        self.refusals, self.joins = refusals, 0

    async def Join(self, request: pb.JoinRequest, context: Context) -> pb.JoinResponse:
        self.joins += 1
        if self.joins <= self.refusals:
            await context.abort(grpc.StatusCode.UNAVAILABLE, GATEWAY_TIMEOUT)
        return pb.JoinResponse(job_token="token", nodes=["n"], created=True, lease_seconds=30)


@asynccontextmanager
async def gateway(service: TimeSlicerService) -> AsyncIterator[str]:
    server = grpc.aio.server()
    pb_grpc.add_TimeSlicerServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def join_blocking(address: str) -> str:
    with timeshare.connect(address) as client:
        job = client.join("g", "a", nodes=["n"])
        job.stop_heartbeats()
        return job.token


async def test_both_clients_send_a_join_again_while_the_gateway_waits_for_its_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(protocol, "RETRY_PAUSE_SECONDS", 0.01)
    service = WaitingGateway(refusals=2)
    async with gateway(service) as address:
        async with timeshare.aio.connect(address) as client:
            job = await client.join("g", "a", nodes=["n"])
            await job.stop_heartbeats()
        assert (job.token, service.joins) == ("token", 3)
        service.joins = 0
        assert await asyncio.to_thread(join_blocking, address) == "token"
        assert service.joins == 3


def test_a_call_sent_again_for_a_while_says_why_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    report = RetryReport("a", "acquire", started=100.0)
    refusal = Unavailable(GATEWAY_TIMEOUT, from_gateway=True)
    for elapsed in (0.5, 5.0, 11.0, 30.0, 72.0):
        report.failed(refusal, 100.0 + elapsed)
    said = [record.getMessage() for record in caplog.records if record.name == "timeshare"]
    assert len(said) == 2, said  # after 11 s, then a minute later
    assert said[0].startswith("job 'a': acquire still refused after 11 s")
    assert all(GATEWAY_TIMEOUT in line for line in said)
