"""What a job's client makes of a failed call: an error naming its cause, and
a Join sent again while the gateway says its Temporal or scheduler did not
answer (as an acquire is), never where no gateway answers at all."""

from __future__ import annotations

import grpc
import pytest

from timeshare import _protocol as protocol
from timeshare.errors import DeadlineExceeded, Unavailable, from_rpc_error

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
