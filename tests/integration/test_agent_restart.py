"""A node agent that restarts still knows which processes are whose: a job
frozen before the restart is thawed by the agent that comes after it. And
the kept registrations never name a process that merely reuses an id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import timeshare
from tests.conftest import REPO
from tests.polling import wait_until
from tests.processes import detached, kill
from timeshare.activities.backends.processes import ProcessTable, alive, start_time
from timeshare.credentials import JOB_TOKEN_ENV
from timeshare.testing import LocalStack, timeshare_command

REGISTERED_COUNTER = """
import sys, time, pathlib
from timeshare.registration import register_process
socket_path, group, job, out = sys.argv[1:]
register_process(group, job, socket_path)
path, n = pathlib.Path(out), 0
while True:
    n += 1
    path.write_text(str(n))
    time.sleep(0.01)
"""


def worker_command(socket_path: str, group: str, job: str, out: Path) -> list[str]:
    return [sys.executable, "-c", REGISTERED_COUNTER, socket_path, group, job, str(out)]


def counting(path: Path, seconds: float = 60) -> bool:
    """Whether the counter in ``path`` moves within ``seconds``."""
    first = path.read_text() if path.exists() else ""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = path.read_text() if path.exists() else ""
        if now and now != first:
            return True
    return False


def still(path: Path) -> bool:
    """The counter in ``path`` stands still for half a second."""
    before = path.read_text()
    time.sleep(0.5)
    return path.read_text() == before


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LocalStack]:
    with LocalStack(tmp_path, backend="freeze") as local:
        yield local


def test_a_job_frozen_before_an_agent_restart_is_thawed_after_it(
    stack: LocalStack, tmp_path: Path
) -> None:
    group, counts = "g", {job: tmp_path / f"count-{job}" for job in "ab"}
    socket_path = str(stack.socket_path)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with timeshare.connect(stack.address) as client:
            a, b = (client.join(group, job, nodes=[stack.node]) for job in "ab")
            # Each worker registers with its own job's token.
            workers = [
                subprocess.Popen(
                    worker_command(socket_path, group, job.name, counts[job.name]),
                    env={**os.environ, JOB_TOKEN_ENV: job.token},
                )
                for job in (a, b)
            ]
            assert all(counting(counts[job]) for job in "ab"), "the workers never counted"
            # The agent process checks tokens with the scheduler: b's worker
            # cannot be put into a, not even by its owner.
            intruder = subprocess.run(
                timeshare_command("register", f"--group={group}", "--job=a",
                                  f"--pid={workers[1].pid}", f"--socket={socket_path}"),
                env={**os.environ, JOB_TOKEN_ENV: b.token}, capture_output=True, text=True,
                cwd=REPO, timeout=120,
            )  # fmt: skip
            assert intruder.returncode != 0 and "belongs to job 'b'" in intruder.stderr
            a.acquire()
            assert still(counts["b"]) and counting(counts["a"])
            b_waits = threading.Thread(target=b.acquire)
            b_waits.start()
            a.yield_()
            b_waits.join(60)
            assert not b_waits.is_alive() and still(counts["a"]) and counting(counts["b"])

            stack.restart("agent")  # SIGKILL: nothing is saved on the way out
            a_waits = threading.Thread(target=a.acquire)
            a_waits.start()
            b.yield_()
            a_waits.join(60)
            assert not a_waits.is_alive()
            assert counting(counts["a"]), "a stayed frozen: the new agent forgot its processes"
            assert still(counts["b"])
            a.yield_()
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()


def test_kept_registrations_drop_exited_and_reused_process_ids(tmp_path: Path) -> None:
    path = tmp_path / "agent.registrations.json"
    living, exiting = (detached(sys.executable, "-c", "import time; time.sleep(30)") for _ in "ab")
    try:
        table = ProcessTable(path)
        table.register("g", "a", living)
        table.register("g", "b", exiting)
        kill(exiting)
        entries = json.loads(path.read_text())
        assert {(e["job"], e["pid"]) for e in entries} == {("a", living), ("b", exiting)}
        wait_until(lambda: not alive(exiting), "the killed process to exit")
        assert ProcessTable(path).processes("g", "a") == [living]
        assert ProcessTable(path).jobs("g") == ["a"]

        # Another process now has the id: it started at another time.
        path.write_text(json.dumps([{"group": "g", "job": "a", "pid": living, "started": "1"}]))
        assert start_time(living) != "1" and ProcessTable(path).jobs("g") == []
        path.write_text("not json")
        assert ProcessTable(path).jobs("g") == []  # and the agent says so in its log
    finally:
        kill(living)
