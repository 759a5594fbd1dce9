"""Failures from Temporal that the gateway names for what they are."""

from __future__ import annotations

import grpc
from temporalio.service import RPCError, RPCStatusCode

from timeshare.workers.gateway_errors import status_for


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
