"""Every service started before Temporal (as a Kubernetes rollout or a
machine's boot may start them) waits for it, says so once, and becomes
ready once Temporal is, without being restarted; then a job takes a turn
through them."""

from __future__ import annotations

from pathlib import Path

import timeshare
from tests.polling import wait_until
from timeshare.testing import LocalStack

SERVICES = ("scheduler", "gateway", "agent")


def test_the_services_started_before_temporal_become_ready_once_it_is(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, state_gib=0.01)
    try:
        offsets = {name: stack.spawn(name) for name in SERVICES}
        wait_until(
            lambda: all("waiting for Temporal" in stack.log_since(n, offsets[n]) for n in SERVICES),
            "every service to say it waits for Temporal",
            seconds=60,
        )
        pids = {name: stack.processes[name].pid for name in SERVICES}
        for name in SERVICES:
            log = stack.log_since(name, offsets[name])
            assert "ready" not in log and stack.processes[name].poll() is None, log
            # Once for the cause, however often it retried.
            assert log.count("waiting for Temporal") == 1, log
        stack.start("temporal")
        for name in SERVICES:
            stack.wait_ready(name, offsets[name])
            assert stack.processes[name].pid == pids[name] and stack.processes[name].poll() is None
            assert "Temporal answers now" in stack.log_since(name, offsets[name])
        with timeshare.connect(stack.address) as client:
            job = client.join("g", "a", nodes=[stack.node])
            with job.turn() as turn:
                assert turn.epoch == 1
            job.leave()
    finally:
        stack.stop_all()
