"""Failures from Temporal that the gateway names for what they are."""

from __future__ import annotations

from typing import Any, cast

import grpc
import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

import timeshare.workers.gateway.group_client as group_client
from timeshare.models import JoinInput, JoinOutput
from timeshare.workers.gateway.errors import status_for


def test_a_group_whose_workflow_task_fails_is_reported_stuck_with_the_way_out() -> None:
    refusal = RPCError(
        "Unable to perform workflow execution update due to Workflow Task in failed state.",
        RPCStatusCode.FAILED_PRECONDITION,
        b"",
    )
    status = status_for(refusal, "demo")
    assert status is not None
    code, message = status
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "group 'demo' is stuck" in message
    assert "temporal workflow terminate --workflow-id timeshare-group-demo" in message


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


JOIN = JoinInput(job="a", nodes=["n"], token_hash="hash-a")
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
