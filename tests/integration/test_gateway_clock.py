"""A gateway on a host whose clock runs 2 s ahead learns so from the first
grant it relays, says so in its log, and reads the groups' moments by the
history hosts' clock from then on (workers/gateway/server_clock.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import timeshare
from tests.polling import wait_until
from timeshare.testing import LocalStack
from timeshare.testing.clock_skew import ClockSkewUnavailable, skewed_environment


def test_a_gateway_whose_clock_runs_ahead_learns_the_history_hosts_clock(tmp_path: Path) -> None:
    try:
        skewed = skewed_environment(2.0, {})
    except ClockSkewUnavailable as error:
        pytest.skip(str(error))
    with LocalStack(tmp_path, state_gib=0.01, part_env={"gateway": skewed}) as stack:
        with timeshare.connect(stack.address) as client:
            job = client.join("g", "a", nodes=[stack.node])
            with job.turn():
                pass
            job.leave()
        said = wait_until(
            lambda: re.search(r"clock runs (\d+\.\d+) s ahead of", stack.log_since("gateway")),
            "the gateway to say how far its clock runs ahead",
        )
    # 2 s, give or take how long the grant took to reach it.
    assert 1.9 < float(said.group(1)) < 2.2
