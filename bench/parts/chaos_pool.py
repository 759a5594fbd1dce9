"""The job processes of the chaos run: started, killed and replaced, each
with the JSON-lines record it writes (see `bench.parts.chaos_job`)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

from bench.parts.chaos_check import JobRecord
from timeshare.testing import LocalStack


@dataclass
class JobSettings:
    until: float
    work_seconds: float
    gap_seconds: float
    lease_seconds: float
    agent_timeout_seconds: float
    continue_as_new_every: int


@dataclass(kw_only=True)
class JobProcess(JobRecord):
    """One process of a job; a replacement is another JobProcess."""

    nodes: list[str]
    gpus: list[int]
    process: subprocess.Popen[bytes]


@dataclass
class JobPool:
    stack: LocalStack
    settings: JobSettings
    processes: list[JobProcess] = field(default_factory=list)

    def start(self, group: str, job: str, nodes: list[str], gpus: list[int]) -> JobProcess:
        """A job of ``group`` on ``nodes``, whose group uses GPUs ``gpus`` of each."""
        events = self.stack.workdir / "events" / f"{job}.{len(self.processes)}.jsonl"
        events.parent.mkdir(exist_ok=True)
        address = self.stack.job_address(len(self.processes))
        settings = asdict(self.settings)  # each setting is the job's option of its name
        command = [
            sys.executable, "-m", "bench.parts.chaos_job", f"--group={group}", f"--job={job}",
            f"--nodes={','.join(nodes)}", f"--address={address}", f"--events={events}",
            f"--gpus={','.join(str(gpu) for gpu in gpus)}",
            *(f"--{name.replace('_', '-')}={value}" for name, value in settings.items()),
        ]  # fmt: skip
        process = self.stack.launch(job, command)
        started = JobProcess(
            group=group, job=job, events_path=events, nodes=nodes, gpus=gpus, process=process
        )
        self.processes.append(started)
        return started

    def running(self) -> list[JobProcess]:
        return [p for p in self.processes if p.killed_at is None and p.process.poll() is None]

    def kill_and_replace(self, victim: JobProcess, rng: random.Random) -> tuple[float, str]:
        """SIGKILL a job process and start its replacement: under the same name
        (which takes over the job's place) or under a new one (the old job
        stays in its group until its lease runs out). Returns when it was killed
        and the replacement's name."""
        killed_at = self.kill(victim)
        base = victim.job.split(".")[0]
        same_name = rng.random() < 0.5
        name = victim.job if same_name else f"{base}.{len(self.processes)}"
        self.start(victim.group, name, victim.nodes, victim.gpus)
        return killed_at, name

    def kill(self, victim: JobProcess) -> float:
        """SIGKILL a job process; returns when."""
        victim.killed_at = time.time()
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(60)
        return victim.killed_at

    def stop(self) -> None:
        for p in self.processes:
            if p.process.poll() is None:
                p.process.kill()
                p.process.wait(60)
