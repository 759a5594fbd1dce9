"""The blog's scenario on one GPU: two RL-shaped PyTorch jobs, busier together.

Each job (timeshare.gpu_check.blog_job) holds --gib of state on the GPU and
loops: sampling (matmuls, ~0.6 s), reward on the host (~1.5 s), training
(matmuls, ~0.4 s). Each job runs first alone, one after the other; then both
share the GPU through a local stack (Temporal dev server, scheduler, gateway,
node agent), once per backend: `hooks` (the jobs' offload hooks move their
tensors; `app+cuda` on the agent) and `cuda` (the driver moves the whole
process). Each job checks its data after every grant.

GPU busy is the mean of NVML's utilisation samples over the time both jobs
ran (alone: over each job's run), never the scheduler's records. On the GPU
emulator the figures are named `emulated_...` and come from the jobs' own
phase times: the emulator runs no kernels, so they check the harness only.

Prints, per backend:
`scenario=blog backend=B busy_alone=… busy_shared=… iteration_ratio=… switches=… switch_p50_s=…`
and appends each outcome as a JSON line to --results.

    python -m timeshare.gpu_check.blog --gib 2 [--emulated] --results FILE
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, Field

import timeshare
from timeshare.self_command import python_module_command
from timeshare.testing import LocalStack

BACKENDS = {"hooks": "app+cuda", "cuda": "cuda"}
# The goals on a GPU (never judged on the emulator).
BUSY_SHARED_LIMIT = {"hooks": 0.75}
ITERATION_RATIO_LIMIT = 1.3
JOB = "timeshare.gpu_check.blog_job"
SAMPLE_SECONDS = 0.1


class JobRun(BaseModel):
    """What one job process reported."""

    phases: list[dict[str, Any]] = Field(default_factory=list)
    iteration_seconds: float | None = None
    checks: int = 0
    verified: int = 0
    ready_at: float = 0.0
    finished_at: float = 0.0
    error: str | None = None


class BlogOutcome(BaseModel):
    backend: str
    emulated: bool
    busy_alone: float | None = None
    busy_shared: float | None = None
    iteration_ratio: float | None = None
    switches: int = 0
    switch_p50_s: float | None = None
    checks: int = 0
    verified: int = 0
    error: str | None = None
    reasons: list[str] = Field(default_factory=list)
    # Why the backend was not measured here (hooks on an emulator host without PyTorch).
    not_measured: str | None = None

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def status(self) -> Literal["ok", "failed", "not_measured"]:
        return "not_measured" if self.not_measured else "ok" if self.ok else "failed"


def judge(outcome: BlogOutcome) -> None:
    """Why the outcome fails, if it does: errors and bad data anywhere; the
    figures' goals on a GPU only."""
    reasons = [outcome.error] if outcome.error else []
    if not outcome.checks:
        reasons.append("no grant was checked")
    elif outcome.verified != outcome.checks:
        reasons.append(f"data read back wrong after {outcome.checks - outcome.verified} grants")
    if not outcome.emulated:
        least = BUSY_SHARED_LIMIT.get(outcome.backend)
        if least is not None and (outcome.busy_shared or 0.0) < least:
            reasons.append(f"busy_shared {outcome.busy_shared} is below {least:.2f}")
        if outcome.iteration_ratio is None or outcome.iteration_ratio > ITERATION_RATIO_LIMIT:
            reasons.append(f"iteration_ratio {outcome.iteration_ratio} is above "
                           f"{ITERATION_RATIO_LIMIT:.2f}")  # fmt: skip
    outcome.reasons = reasons


class UtilisationSampler:
    """NVML's GPU utilisation, sampled in a thread: (time, percent) pairs."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> UtilisationSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            while not self._stop.wait(SAMPLE_SECONDS):
                rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
                self.samples.append((time.time(), float(rates.gpu)))
        finally:
            pynvml.nvmlShutdown()

    def busy(self, start: float, end: float) -> float | None:
        inside = [percent for at, percent in self.samples if start <= at <= end]
        return statistics.fmean(inside) / 100 if inside else None


def phase_busy(runs: list[JobRun], start: float, end: float) -> float | None:
    """The share of [start, end] in which some job ran a GPU phase (emulated)."""
    if end <= start:
        return None
    spans = sorted(
        (max(p["start"], start), min(p["end"], end))
        for run in runs
        for p in run.phases
        if p["end"] > start and p["start"] < end
    )
    covered, reach = 0.0, start
    for low, high in spans:
        low = max(low, reach)
        if high > low:
            covered, reach = covered + high - low, high
    return covered / (end - start)


def start_job(args: argparse.Namespace, seed: int, env: dict[str, str],
              joined: tuple[str, str, str] | None = None,
              hooks: bool = False) -> JobProcess:  # fmt: skip
    command = [*python_module_command(JOB), f"--gib={args.gib}", f"--seed={seed}",
               f"--iterations={args.iterations}"]  # fmt: skip
    if joined:
        group, job, address = joined
        command += [f"--group={group}", f"--job={job}", f"--address={address}"]
    command += ["--hooks"] if hooks else []
    command += ["--emulated"] if args.emulated else []
    # Its errors go to a file (a pipe nobody reads could fill and stop it); their
    # last line goes into the outcome's reason.
    errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by collect)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
    return JobProcess(process, errors)


@dataclass
class JobProcess:
    process: subprocess.Popen[str]
    errors: IO[str]

    def last_error_line(self) -> str:
        self.errors.seek(0)
        lines = [line.strip() for line in self.errors.read().splitlines() if line.strip()]
        return lines[-1] if lines else ""


def collect(job: JobProcess) -> JobRun:
    run, process = JobRun(), job.process
    assert process.stdout is not None
    for line in process.stdout:
        entry = json.loads(line) if line.startswith("{") else {}
        if entry.get("ready"):
            run.ready_at = time.time()
        elif "phase" in entry:
            run.phases.append(entry)
        elif "iterations" in entry:
            run.iteration_seconds = entry["iteration_seconds"]
            run.checks, run.verified = entry["checks"], entry["verified"]
    if process.wait() != 0 or run.iteration_seconds is None:
        said = job.last_error_line()
        run.error = f"job process {process.pid} exited {process.returncode}" + (
            f": {said}" if said else ""
        )
    job.errors.close()
    run.finished_at = time.time()
    return run


def run_together(processes: list[JobProcess]) -> list[JobRun]:
    runs: list[JobRun] = [JobRun() for _ in processes]

    def one(index: int) -> None:
        runs[index] = collect(processes[index])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(processes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return runs


def window(runs: list[JobRun]) -> tuple[float, float]:
    """From the first GPU phase of the last job to start to the end of the
    first job to finish: the time all ran."""
    starts = [run.phases[0]["start"] for run in runs if run.phases]
    ends = [run.phases[-1]["end"] for run in runs if run.phases]
    if len(starts) < len(runs):
        return 0.0, 0.0
    return max(starts), min(ends)


def busy(runs: list[JobRun], sampler: UtilisationSampler | None) -> float | None:
    start, end = window(runs)
    if sampler is None:
        return phase_busy(runs, start, end)
    return sampler.busy(start, end)


def alone(args: argparse.Namespace) -> tuple[list[JobRun], list[float]]:
    """Each job on the GPU by itself, one after the other."""
    runs, busies = [], []
    for seed in (0, 1):
        with Sampling(args.emulated) as sampler:
            run = collect(start_job(args, seed, dict(os.environ)))
        runs.append(run)
        value = busy([run], sampler)
        if value is not None:
            busies.append(value)
    return runs, busies


class Sampling:
    """NVML sampling on a GPU; none on the emulator, whose NVML reads a setting."""

    def __init__(self, emulated: bool) -> None:
        self.sampler = None if emulated else UtilisationSampler()

    def __enter__(self) -> UtilisationSampler | None:
        return self.sampler.__enter__() if self.sampler else None

    def __exit__(self, *exc: object) -> None:
        if self.sampler:
            self.sampler.__exit__(*exc)


def shared(args: argparse.Namespace, stack: LocalStack,
           name: str) -> tuple[list[JobRun], float | None, int]:  # fmt: skip
    group = f"blog-{name}"
    env = {**os.environ, "TIMESHARE_AGENT_SOCKET": str(stack.socket_path)}
    with Sampling(args.emulated) as sampler:
        processes = [
            start_job(args, seed, env, (group, f"job-{seed}", stack.address), name == "hooks")
            for seed in (0, 1)
        ]
        runs = run_together(processes)
    with timeshare.connect(stack.address) as client:
        switches = client.get_group(group).switches
    return runs, busy(runs, sampler), switches


def measure(args: argparse.Namespace, stack: LocalStack, name: str, alone_runs: list[JobRun],
            alone_busy: list[float]) -> BlogOutcome:  # fmt: skip
    outcome = BlogOutcome(backend=name, emulated=args.emulated)
    outcome.busy_alone = statistics.fmean(alone_busy) if alone_busy else None
    wanted = BACKENDS[name]
    if stack.backend != wanted:
        stack.backend = wanted
        stack.restart("agent")
    runs, outcome.busy_shared, outcome.switches = shared(args, stack, name)
    errors = [run.error for run in [*alone_runs, *runs] if run.error]
    outcome.error = "; ".join(errors) or None
    outcome.checks = sum(run.checks for run in runs)
    outcome.verified = sum(run.verified for run in runs)
    times = [run.iteration_seconds for run in runs if run.iteration_seconds]
    before = [run.iteration_seconds for run in alone_runs if run.iteration_seconds]
    if times and before:
        outcome.iteration_ratio = statistics.fmean(times) / statistics.fmean(before)
    waits = [p["switch_seconds"] for run in runs for p in run.phases if p["switch_seconds"] > 0]
    outcome.switch_p50_s = statistics.median(waits) if waits else None
    return outcome


def outcome_figures(outcome: BlogOutcome) -> dict[str, str]:
    """The outcome's figures, in the order its line shows them."""
    prefix = "emulated_" if outcome.emulated else ""

    def value(number: float | None, digits: int = 2) -> str:
        return "unmeasured" if number is None else f"{number:.{digits}f}"

    return {
        "backend": outcome.backend,
        f"{prefix}busy_alone": value(outcome.busy_alone),
        f"{prefix}busy_shared": value(outcome.busy_shared),
        f"{prefix}iteration_ratio": value(outcome.iteration_ratio),
        "switches": str(outcome.switches),
        f"{prefix}switch_p50_s": value(outcome.switch_p50_s, 3),
        "verified": f"{outcome.verified}/{outcome.checks}",
    }


def line(outcome: BlogOutcome) -> str:
    parts = [
        "scenario=blog",
        *(f"{key}={value}" for key, value in outcome_figures(outcome).items()),
    ]
    parts.append(f"status={outcome.status}")
    reason = outcome.not_measured or "; ".join(outcome.reasons)
    if reason:
        parts.append(f"reason={json.dumps(reason)}")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m timeshare.gpu_check.blog")
    parser.add_argument("--gib", type=float, default=2.0, help="state per job (GiB)")
    parser.add_argument("--iterations", type=int, default=6, help="RL iterations per run")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"comma-separated, of {', '.join(BACKENDS)}")  # fmt: skip
    parser.add_argument("--emulated", action="store_true", help="on the GPU emulator")
    parser.add_argument("--results", type=Path, help="append each outcome (JSON lines)")
    args = parser.parse_args(argv)
    names = [name for name in args.backends.split(",") if name]
    if set(names) - set(BACKENDS):
        parser.error(f"no backend {', '.join(sorted(set(names) - set(BACKENDS)))}")
    alone_runs, alone_busy = alone(args)
    failed = False
    with tempfile.TemporaryDirectory(prefix="gpu-check-blog-") as scratch:
        stack = LocalStack(Path(scratch), backend=BACKENDS[names[0]] if names else "cuda")
        try:
            stack.start_all()
            for name in names:
                try:
                    if name == "hooks" and importlib.util.find_spec("torch") is None:
                        # Only on the emulator: on a GPU host the check skips the step.
                        missing = "PyTorch is not installed here"
                        outcome = BlogOutcome(backend=name, emulated=args.emulated,
                                              not_measured=missing)  # fmt: skip
                    else:
                        outcome = measure(args, stack, name, alone_runs, alone_busy)
                except Exception as error:  # one backend's failure is reported; the next runs
                    outcome = BlogOutcome(backend=name, emulated=args.emulated,
                                          error=f"{type(error).__name__}: {error}")  # fmt: skip
                if outcome.not_measured is None:
                    judge(outcome)
                failed |= not outcome.ok
                print(line(outcome), flush=True)
                if args.results:
                    with args.results.open("a") as results:
                        results.write(outcome.model_dump_json() + "\n")
        finally:
            stack.stop_all()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
