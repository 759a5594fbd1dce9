"""Two scheduler workers and two gateways against one Temporal, as separate
processes: jobs given both gateways go on taking turns through the other
one when theirs is killed and stays down, and the group goes on being
served when one scheduler is killed and stays down."""

from __future__ import annotations

import signal
import threading
from functools import partial
from pathlib import Path

import timeshare
from tests.polling import wait_until
from timeshare.testing import LocalStack

GROUP = "replicas"


def take_turns(job: timeshare.Job, turns: list[str], stop: threading.Event) -> None:
    while not stop.is_set():
        with job.turn():
            turns.append(job.name)


def both_took_turns_since(turns: list[str], start: int) -> bool:
    return {"job-0", "job-1"} <= set(turns[start:])


def test_jobs_take_turns_while_one_replica_of_each_is_down(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, state_gib=0.0, schedulers=2, gateways=2)
    assert stack.scheduler_parts == ["scheduler", "scheduler-2"]
    assert stack.gateway_parts == ["gateway", "gateway-2"]
    # Neighbouring jobs start at different gateways; each is given both.
    assert stack.job_address(0) == f"ipv4:{stack.addresses[0]},{stack.addresses[1]}"
    assert stack.job_address(1) == f"ipv4:{stack.addresses[1]},{stack.addresses[0]}"
    turns: list[str] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    clients = [timeshare.connect(stack.job_address(i)) for i in range(2)]
    try:
        stack.start_all()
        jobs = [
            client.join(GROUP, f"job-{i}", nodes=[stack.node]) for i, client in enumerate(clients)
        ]
        threads = [
            threading.Thread(target=take_turns, args=(job, turns, stop), daemon=True)
            for job in jobs
        ]
        for thread in threads:
            thread.start()
        for part in ("gateway", "scheduler"):
            before = len(turns)
            stack.kill(part, signal.SIGKILL)
            # Both jobs' turns go on, one of them through the gateway it did not start at.
            wait_until(
                partial(both_took_turns_since, turns, before + 2),
                f"both jobs taking turns with {part} down",
                seconds=60,
            )
        assert stack.processes["gateway"].poll() is not None
        assert stack.processes["scheduler"].poll() is not None
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        for client in clients:
            client.close()
        stack.stop_all()
