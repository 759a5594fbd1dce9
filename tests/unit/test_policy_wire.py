"""The group policy on the wire: what the client sends, the gateway reads,
and the status reports back (no server needed)."""

from __future__ import annotations

import pytest

import timeshare.workers.gateway.convert as gateway_convert
from timeshare import _protocol as protocol
from timeshare.models import GroupPolicy, GroupStatus
from timeshare.status import policy_line
from timeshare.v1 import timeshare_pb2 as pb
from timeshare.workers.gateway import messages
from timeshare.workers.gateway.errors import InvalidRequest


def test_co_residency_travels_from_the_client_to_the_status() -> None:
    sent = protocol.join_request("g", "a", ["n"], GroupPolicy(co_residency="off"))
    received = gateway_convert.policy(sent.policy)
    assert received.co_residency == "off"
    status = GroupStatus(group="g", state="idle", policy=received)
    assert protocol.group_status(messages.group_status(status)).policy == received


def test_co_residency_defaults_to_auto_and_refuses_other_words() -> None:
    assert gateway_convert.policy(pb.GroupPolicy()).co_residency == "auto"
    with pytest.raises(InvalidRequest, match=r"policy\.co_residency"):
        gateway_convert.policy(pb.GroupPolicy(co_residency="sometimes"))


@pytest.mark.parametrize(
    "sent",
    [
        GroupPolicy(switch_cost_aware=False),
        GroupPolicy(switch_cost_seconds=2.5),
        GroupPolicy(switch_cost_aware=False, switch_cost_seconds=0.0),
    ],
)
def test_switch_cost_settings_travel_from_the_client_to_the_status(sent: GroupPolicy) -> None:
    received = gateway_convert.policy(protocol.join_request("g", "a", ["n"], sent).policy)
    assert (received.switch_cost_aware, received.switch_cost_seconds) == (
        sent.switch_cost_aware,
        sent.switch_cost_seconds,
    )
    status = GroupStatus(group="g", state="idle", policy=received)
    assert protocol.group_status(messages.group_status(status)).policy == received


def test_unset_switch_cost_settings_keep_their_defaults() -> None:
    received = gateway_convert.policy(pb.GroupPolicy())
    assert received.switch_cost_aware is True
    assert received.switch_cost_seconds is None
    with pytest.raises(InvalidRequest, match=r"policy\.switch_cost_seconds"):
        gateway_convert.policy(pb.GroupPolicy(switch_cost_seconds=-1.0))


def test_timeshare_status_says_how_switch_costs_are_weighed() -> None:
    def line(policy: GroupPolicy) -> str:
        return policy_line(GroupStatus(group="g", state="idle", policy=policy))

    assert "switch cost" not in line(GroupPolicy())
    assert "a switch costs 2.5 s (set)" in line(GroupPolicy(switch_cost_seconds=2.5))
    assert "switch costs not weighed" in line(GroupPolicy(switch_cost_aware=False))
