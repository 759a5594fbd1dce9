"""The group policy on the wire: what the client sends, the gateway reads,
and the status reports back (no server needed)."""

from __future__ import annotations

import pytest

import timeshare.workers.gateway.convert as gateway_convert
from timeshare import _protocol as protocol
from timeshare.models import GroupPolicy, GroupStatus
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workers.gateway.errors import InvalidRequest


def test_co_residency_travels_from_the_client_to_the_status() -> None:
    sent = protocol.join_request("g", "a", ["n"], GroupPolicy(co_residency="off"))
    received = gateway_convert.policy(sent.policy)
    assert received.co_residency == "off"
    status = GroupStatus(group="g", state="idle", policy=received)
    assert protocol.group_status(gateway_convert.group_status(status)).policy == received


def test_co_residency_defaults_to_auto_and_refuses_other_words() -> None:
    assert gateway_convert.policy(pb.GroupPolicy()).co_residency == "auto"
    with pytest.raises(InvalidRequest, match=r"policy\.co_residency"):
        gateway_convert.policy(pb.GroupPolicy(co_residency="sometimes"))
