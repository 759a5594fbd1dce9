"""The history hosts' clock as a gateway learns it from the grants it relays
(workers/gateway/server_clock.py): a gateway whose own clock is 2 s off
reads a group's moments to within the quickest delivery of a grant."""

from __future__ import annotations

import time

import pytest

from timeshare.workers.gateway.server_clock import SAMPLE_SECONDS, ServerClock


def test_a_clock_that_learned_nothing_is_the_gateways_own() -> None:
    clock = ServerClock()
    assert clock.offset == 0.0
    assert clock.now() == pytest.approx(time.time(), abs=0.01)


@pytest.mark.parametrize("skew", [2.0, -2.0])
def test_the_smallest_arrival_after_a_grant_is_the_skew(skew: float) -> None:
    """Grants delivered 5, 40 and 12 ms after the group made them, to a
    gateway whose clock runs ``skew`` seconds off the history hosts'."""
    clock = ServerClock()
    now = time.time()
    for made, delivery in ((now - 3.0, 0.005), (now - 2.0, 0.040), (now - 1.0, 0.012)):
        clock.note(granted_at=made, arrived_at=made + delivery + skew)
    assert clock.offset == pytest.approx(skew + 0.005)
    assert clock.now() == pytest.approx(time.time() - skew - 0.005, abs=0.01)


def test_an_old_grant_answered_again_teaches_nothing_wrong() -> None:
    """A grant re-sent long after it was made (a restarted gateway's retry)
    arrives late: it never lowers the offset below a fresh one's."""
    clock = ServerClock()
    now = time.time()
    clock.note(granted_at=now - 0.010, arrived_at=now)
    clock.note(granted_at=now - 30.0, arrived_at=now)
    assert clock.offset == pytest.approx(0.010)


def test_a_clock_set_right_is_trusted_again_once_the_old_grants_age_out() -> None:
    clock = ServerClock()
    now = time.time()
    clock.note(granted_at=now - SAMPLE_SECONDS - 10, arrived_at=now - SAMPLE_SECONDS - 8)
    clock.note(granted_at=now - 1.0, arrived_at=now - 0.99)
    assert clock.offset == pytest.approx(0.01)
