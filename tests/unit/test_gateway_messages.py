"""The gateway's one table between the public API and the core's events
(workers/gateway/messages.py): each event field comes from the request's
field of its name, checked, and each response field from the answer."""

from __future__ import annotations

import dataclasses

import pytest
from google.protobuf.message import Message

from timeshare.credentials import token_hash
from timeshare.models import Grant
from timeshare.scheduling import events as ev
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workers.gateway import messages
from timeshare.workers.gateway.errors import InvalidRequest

# Each event a request becomes, and the fields the gateway gives it itself.
REQUESTS = [
    (ev.Join, pb.JoinRequest, {"token_hash"}),
    (ev.Acquire, pb.AcquireRequest, {"trace_context", "call_id", "timeout_seconds"}),
    (ev.Yield, pb.YieldRequest, set()),
    (ev.KeepTurn, pb.KeepTurnRequest, set()),
    (ev.Heartbeat, pb.HeartbeatRequest, set()),
    (ev.Leave, pb.LeaveRequest, set()),
    (ev.Evict, pb.EvictRequest, set()),
    (ev.Pause, pb.PauseRequest, set()),
    (ev.Drain, pb.DrainRequest, set()),
]


@pytest.mark.parametrize(("event", "request_kind", "given"), REQUESTS)
def test_every_field_of_an_event_comes_from_its_request_or_the_gateway(
    event: type, request_kind: type[Message], given: set[str]
) -> None:
    present = request_kind.DESCRIPTOR.fields_by_name
    for field in dataclasses.fields(event):
        source = messages.SOURCES.get(field.name, field.name)
        assert source in present or field.name in given, (event.__name__, field.name)


def test_an_acquire_is_checked_and_its_token_hashed() -> None:
    request = pb.AcquireRequest(
        group="g", job="a", job_token="secret", request_id="r1", phase="train", yield_epoch=3
    )
    acquire = messages.event_of(ev.Acquire, request, timeout_seconds=2.0)
    assert acquire == ev.Acquire(
        job="a", token_hash=token_hash("secret"), request_id="r1", phase="train",
        yield_epoch=3, timeout_seconds=2.0,
    )  # fmt: skip
    with pytest.raises(InvalidRequest, match="job"):
        messages.event_of(ev.Acquire, pb.AcquireRequest(job="Not A Name", job_token="t"))


def test_a_join_takes_the_default_weight_for_an_unset_one() -> None:
    join = messages.event_of(ev.Join, pb.JoinRequest(job="a", nodes=["n"]), token_hash="h")
    assert (join.weight, join.priority, join.nodes) == (1.0, 0, ["n"])
    with pytest.raises(InvalidRequest, match="weight"):
        messages.event_of(ev.Join, pb.JoinRequest(job="a", weight=-1), token_hash="h")


def test_a_grant_answers_with_the_epoch_its_job_is_told() -> None:
    grant = Grant(
        job="a", request_id="r", epoch=7, ticket=2, granted_at=1.0, waited_seconds=0.5,
        switch_seconds=0.1, resumes_epoch=4, told_epoch=4, phase="train",
    )  # fmt: skip
    answer = messages.reply(pb.AcquireResponse, grant, {"epoch": "told_epoch"})
    assert answer == pb.AcquireResponse(
        epoch=4, ticket=2, waited_seconds=0.5, switch_seconds=0.1, granted_at=1.0, phase="train"
    )
