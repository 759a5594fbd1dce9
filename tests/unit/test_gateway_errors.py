"""Failures from Temporal that the gateway names for what they are."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc
import pytest
from temporalio.client import Client, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

import timeshare.aio
import timeshare.workers.gateway.group_client as group_client
from timeshare.errors import Internal
from timeshare.models import AcquireResult, Grant, JoinOutput
from timeshare.scheduling import events as ev
from timeshare.v1 import timeshare_pb2_grpc as pb_grpc
from timeshare.workers.gateway.errors import status_for
from timeshare.workers.gateway.group_client import GroupHandle
from timeshare.workers.gateway.serve import TimeSlicerService
from timeshare.workflows.group import GroupWorkflow


def test_a_group_whose_workflow_task_fails_is_reported_as_healing_by_itself() -> None:
    refusal = RPCError(
        "Unable to perform workflow execution update due to Workflow Task in failed state.",
        RPCStatusCode.FAILED_PRECONDITION,
        b"",
    )
    status = status_for(refusal, "demo")
    assert status is not None
    code, message = status
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "group 'demo' is stuck for now" in message and "heals such a group by itself" in message
    # No person needs to end the group (docs/reliability.md).
    assert "terminate" not in message


def test_other_refusals_say_to_retry() -> None:
    status = status_for(RPCError("busy", RPCStatusCode.UNAVAILABLE, b""), "demo")
    assert status is not None and "retry" in status[1] and "stuck" not in status[1]


class RefusingTemporal:
    """Answers update-with-start as Temporal does while a group's failed
    workflow task is retried (after a restart), ``refusals`` times."""

    def __init__(self, refusals: int, message: str) -> None:
        self.refusals, self.message, self.calls = refusals, message, 0

    async def execute_update_with_start_workflow(self, *args: Any, **kwargs: Any) -> JoinOutput:
        self.calls += 1
        if self.calls <= self.refusals:
            raise RPCError(self.message, RPCStatusCode.FAILED_PRECONDITION, b"")
        return JOINED


JOIN = ev.Join(job="a", nodes=["n"], token_hash="hash-a")
JOINED = JoinOutput(created=True, nodes=["n"])
TRANSIENT = "Unable to perform workflow execution update due to unexpected workflow task failure."


async def test_a_join_refused_while_a_workflow_task_is_retried_is_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group_client, "JOIN_RETRY_PAUSE_SECONDS", 0.01)
    temporal = RefusingTemporal(3, TRANSIENT)
    assert await group_client.join_group(cast(Client, temporal), "g", JOIN) == JOINED
    assert temporal.calls == 4


async def test_a_join_is_not_sent_again_for_other_refusals_nor_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group_client, "JOIN_RETRY_PAUSE_SECONDS", 0.01)
    monkeypatch.setattr(group_client, "JOIN_RETRY_SECONDS", 0.1)
    other = RefusingTemporal(1, "namespace not found")
    with pytest.raises(RPCError):
        await group_client.join_group(cast(Client, other), "g", JOIN)
    assert other.calls == 1
    stuck = RefusingTemporal(10**6, "Workflow Task in failed state")
    with pytest.raises(RPCError):
        await group_client.join_group(cast(Client, stuck), "g", JOIN)
    assert 1 < stuck.calls < 10**6


def test_temporal_not_answering_in_time_is_named_and_worth_a_retry() -> None:
    status = status_for(WorkflowUpdateRPCTimeoutOrCancelledError(), "demo")
    assert status is not None
    code, message = status
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "Temporal did not answer in time" in message and "retry" in message


class TimingOutTemporal:
    """A group handle whose update call Temporal cuts off ``timeouts`` times
    (its own deadline, not the caller's) before the grant comes."""

    def __init__(self, timeouts: int) -> None:
        self.timeouts, self.calls = timeouts, 0

    async def execute_update(self, *args: Any, **kwargs: Any) -> AcquireResult:
        self.calls += 1
        if self.calls <= self.timeouts:
            raise WorkflowUpdateRPCTimeoutOrCancelledError()
        return AcquireResult(grant=GRANT)


GRANT = Grant(
    job="a",
    request_id="r1",
    epoch=1,
    ticket=1,
    waited_seconds=0.0,
    switch_seconds=0.0,
    granted_at=0.0,
)
ASK = ev.Acquire(job="a", token_hash="hash-a", request_id="r1")


async def test_an_acquire_that_temporal_cut_off_is_sent_again_not_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group_client, "RESEND_PAUSE_SECONDS", 0.01)
    temporal = TimingOutTemporal(2)
    grant = await group_client.acquire_or_withdraw(cast(GroupHandle, temporal), ASK, set())
    assert grant == GRANT
    assert temporal.calls == 3


class WaitingTemporal:
    """A group handle whose acquire waits for its grant, as the SDK does: a
    cancelled wait raises the SDK's timeout-or-cancelled error."""

    def __init__(self) -> None:
        self.withdrawn = asyncio.Event()

    async def execute_update(self, update: Any, *args: Any, **kwargs: Any) -> object:
        if update == GroupWorkflow.cancel_acquire:
            self.withdrawn.set()
            return True
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise WorkflowUpdateRPCTimeoutOrCancelledError() from None
        raise AssertionError("unreachable")


async def test_an_acquire_whose_caller_went_away_is_withdrawn() -> None:
    temporal = WaitingTemporal()
    call = asyncio.create_task(
        group_client.acquire_or_withdraw(cast(GroupHandle, temporal), ASK, set())
    )
    await asyncio.sleep(0.05)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(temporal.withdrawn.wait(), 30)


class BrokenTemporal:
    """A Temporal client that fails in a way the gateway does not expect."""

    def get_workflow_handle_for(self, *args: Any, **kwargs: Any) -> None:
        raise KeyError("no such entry")


async def test_an_unexpected_gateway_failure_reaches_the_job_named() -> None:
    server = grpc.aio.server()
    service = TimeSlicerService(cast(Client, BrokenTemporal()))
    pb_grpc.add_TimeSlicerServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with timeshare.aio.connect(f"127.0.0.1:{port}") as client:
            with pytest.raises(Internal) as failure:
                await client.join("g", "a", nodes=["n"])
    finally:
        await server.stop(None)
    assert "the gateway failed on Join: KeyError: 'no such entry'" in str(failure.value)


def test_a_call_whose_run_ended_under_it_is_to_be_sent_again_not_a_missing_group() -> None:
    """A group healed in a new run (or continued as new) while a yield waited:
    Temporal says the run is over; the group is not gone, and the client
    sends the call again to the new run."""
    for message in ("workflow execution already completed", "workflow update was aborted by "
                    "closing workflow"):  # fmt: skip
        status = status_for(RPCError(message, RPCStatusCode.NOT_FOUND, b""), "demo")
        assert status is not None and status[0] == grpc.StatusCode.UNAVAILABLE, message
        assert "retry" in status[1] and "does not exist" not in status[1]
    gone = status_for(RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b""), "demo")
    assert gone is not None and gone[0] == grpc.StatusCode.NOT_FOUND
