"""Short runs of a few jobs taking turns in a new group, each job's failure
kept with its run, against a `timeshare up` started (again) on fresh ports
and a fresh data directory."""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel

import timeshare
from timeshare.testing import free_port, timeshare_command
from timeshare.workers.common.children import spawn

UP_READY = "timeshare up: ready"
UP_READY_SECONDS = 120.0
JOB_SECONDS = 300.0


class JobOutcome(BaseModel):
    job: str
    turns: int
    # The job's failure, as its client raised it (empty: none).
    error: str = ""


class RunOutcome(BaseModel):
    run: int
    group: str
    # The run started as soon as a fresh stack said it was ready.
    after_ready: bool
    jobs: list[JobOutcome]

    def turns(self) -> int:
        return sum(job.turns for job in self.jobs)

    def errors(self) -> list[JobOutcome]:
        return [job for job in self.jobs if job.error]


def take_turns(address: str, group: str, job: str, turns: int, turn_seconds: float) -> JobOutcome:
    """One job as a user writes it: join (its node left to the gateway), take
    its turns, leave. A failure ends the job and is kept: its kind, message
    and where it was raised."""
    taken = 0
    try:
        with timeshare.connect(address) as client:
            handle = client.join(group, job)
            for _ in range(turns):
                with handle.turn():
                    time.sleep(turn_seconds)
                taken += 1
            handle.leave()
    except Exception as error:
        return JobOutcome(job=job, turns=taken, error=describe(error))
    return JobOutcome(job=job, turns=taken)


def describe(error: BaseException) -> str:
    """The error as the job saw it: its type, message and where it came from."""
    where = traceback.extract_tb(error.__traceback__)[-1:]
    origin = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
    return f"{type(error).__name__}: {error}{origin}"


def run_group(
    address: str,
    run: int,
    group: str,
    jobs: int,
    turns: int,
    turn_seconds: float,
    after_ready: bool = False,
) -> RunOutcome:
    """Every job in a thread of its own, started together."""
    names = [f"job-{index}" for index in range(jobs)]
    outcomes: dict[str, JobOutcome] = {}
    start = threading.Barrier(len(names))

    def job(name: str) -> None:
        try:
            start.wait()
            outcomes[name] = take_turns(address, group, name, turns, turn_seconds)
        except BaseException as error:  # kept: a job's thread must not die unheard
            outcomes[name] = JobOutcome(job=name, turns=0, error=describe(error))

    threads = [threading.Thread(target=job, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + JOB_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    results = [
        outcomes.get(name)
        or JobOutcome(job=name, turns=0, error=f"still running after {JOB_SECONDS:g} s")
        for name in names
    ]
    return RunOutcome(run=run, group=group, after_ready=after_ready, jobs=results)


class UpStack:
    """A `timeshare up` on fresh ports and a fresh data directory; its output in ``log``."""

    def __init__(self, workdir: Path, options: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        # Further options of `timeshare up` (its defaults otherwise).
        self.options = options
        self.log = workdir / "up.log"
        self.gateway_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gateway_port}"

    def start(self) -> None:
        command = timeshare_command(
            "up", f"--port={free_port()}", f"--ui-port={free_port()}",
            f"--listen={self.address}", f"--data-dir={self.workdir / 'data'}",
            "--node=short-runs", *self.options,
        )  # fmt: skip
        with self.log.open("ab") as log:
            # Dies with this process, however it ends.
            self.process = spawn(command, stdout=log, timeshare_child=True)
        deadline = time.monotonic() + UP_READY_SECONDS
        while time.monotonic() < deadline:
            if UP_READY in self.log.read_text(errors="replace"):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        tail = self.log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"`timeshare up` was not ready: {tail}")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def fresh_up(options: tuple[str, ...] = (), keep_logs: Path | None = None) -> Iterator[UpStack]:
    """A `timeshare up` of its own (with ``options``), stopped on leaving;
    its log is copied into ``keep_logs`` if given."""
    with tempfile.TemporaryDirectory(prefix="timeshare-short-runs-") as scratch:
        stack = UpStack(Path(scratch), options)
        try:
            stack.start()
            yield stack
        finally:
            stack.stop()
            if keep_logs is not None:
                keep_logs.mkdir(parents=True, exist_ok=True)
                target = keep_logs / f"up-{stack.gateway_port}.log"
                target.write_bytes(stack.log.read_bytes())
