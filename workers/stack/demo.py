"""`timeshare demo`: two synthetic RL jobs take turns on one (simulated) GPU.

Starts the embedded stack unless a gateway already answers on
localhost:50051, runs the jobs as separate processes through the public
client library, then prints the timeline and the utilisation gained.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from timeshare.errors import TimeshareError
from timeshare.report import write_report
from timeshare.self_command import timeshare_command
from timeshare.synthetic import load_report
from timeshare.timeline import chart, summary, turns_table, utilisation
from timeshare.workers.common.children import spawn, stop_process
from timeshare.workers.common.service import StartupError

DEMO_ADDRESS = "localhost:50051"
# Where `timeshare up` (the embedded stack) serves Temporal.
EMBEDDED_TEMPORAL = "localhost:7233"
DEMO_GROUP = "demo"
DEMO_JOBS = ("job-a", "job-b")
STACK_READY_SECONDS = 90.0


def gateway_answers(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1.0
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def say(message: str) -> None:
    print(f"timeshare demo: {message}", flush=True)


def start_stack(data_dir: Path) -> subprocess.Popen[bytes]:
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "demo-stack.log"
    say(f"starting the embedded stack (log: {log_path}) ...")
    stack = spawn(
        timeshare_command("up", f"--data-dir={data_dir}", "--node=local"),
        stdout=subprocess.PIPE,
        new_session=True,
        timeshare_child=True,
    )
    is_ready = threading.Event()

    def copy_log() -> None:
        assert stack.stdout is not None
        with log_path.open("ab") as log:
            for line in stack.stdout:
                log.write(line)
                log.flush()
                if b"timeshare up: ready:" in line:
                    is_ready.set()

    threading.Thread(target=copy_log, daemon=True).start()
    started = time.monotonic()
    while not is_ready.wait(5.0):
        if stack.poll() is not None or time.monotonic() - started > STACK_READY_SECONDS:
            stop_process(stack)
            tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(
                "the embedded stack did not start: " + " | ".join(tail) + f" (see {log_path})"
            )
        say(f"... still starting ({time.monotonic() - started:.0f} s)")
    say(f"stack ready in {time.monotonic() - started:.1f} s; Temporal UI http://localhost:8233")
    return stack


def start_fresh_group() -> None:
    """End the demo group a previous run left in the embedded stack, so this
    run's figures and report are its own, and a group written by an older
    timeshare never stands in the way."""
    import asyncio

    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    from timeshare.names import group_workflow_id
    from timeshare.workers.common.service import connect_temporal

    async def end_previous() -> bool:
        client = await connect_temporal(EMBEDDED_TEMPORAL)
        handle = client.get_workflow_handle(group_workflow_id(DEMO_GROUP))
        try:
            if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
                return False
            await handle.terminate(reason="timeshare demo starts from a fresh group")
        except RPCError:  # no such workflow (the first run), or it ended meanwhile
            return False
        return True

    if asyncio.run(end_previous()):
        say(f"ended the group {DEMO_GROUP!r} a previous demo left; this run starts afresh")


def run_jobs(
    iterations: int, reports_dir: Path, stack: subprocess.Popen[bytes] | None
) -> list[Path]:
    paths = [reports_dir / f"{job}.json" for job in DEMO_JOBS]
    jobs = [
        spawn(
            timeshare_command(
                "synthetic-job",
                f"--group={DEMO_GROUP}", f"--job={job}", f"--address={DEMO_ADDRESS}",
                f"--iterations={iterations}", f"--report={path}",
                f"--start-delay-seconds={0.3 * index}",
            ),
            new_session=True,
            timeshare_child=True,
        )
        for index, (job, path) in enumerate(zip(DEMO_JOBS, paths, strict=True))
    ]  # fmt: skip
    try:
        while any(job.poll() is None for job in jobs):
            if stack is not None and stack.poll() is not None:
                raise RuntimeError("the embedded stack stopped; see demo-stack.log in its data dir")
            time.sleep(0.5)
        codes = [job.wait() for job in jobs]
    finally:
        for job in jobs:
            stop_process(job)
    if any(codes):
        raise RuntimeError(f"a synthetic job failed (exit codes {codes})")
    return paths


def write_timeline(data_dir: Path) -> Path:
    """The scheduler's own record of the run, drawn as `timeshare report` does."""
    import timeshare

    with timeshare.connect(DEMO_ADDRESS) as client:
        history = client.group_history(DEMO_GROUP)
    return write_report(history, (data_dir / "demo-report.html").resolve())


def run_demo(iterations: int, data_dir: Path) -> int:
    stack = None
    try:
        if gateway_answers(DEMO_ADDRESS):
            say(f"using the timeshare stack already running at {DEMO_ADDRESS}")
        else:
            stack = start_stack(data_dir)
            start_fresh_group()
        say(
            f"two synthetic RL jobs, {iterations} iterations each: sample (GPU), "
            "reward (CPU), train (GPU); the GPU is SIMULATED by the sim backend"
        )
        with tempfile.TemporaryDirectory() as scratch:
            reports = [load_report(p) for p in run_jobs(iterations, Path(scratch), stack)]
        print()
        print(chart(reports))
        print("  S sample, T train (GPU)   - reward (CPU)   . waiting for the GPU")
        print()
        print(turns_table(reports))
        print()
        print(summary(utilisation(reports)))
        print()
        say(f"timeline of the group's turns and switches: {write_timeline(data_dir)}")
        return 0
    except (RuntimeError, TimeshareError, StartupError) as error:
        print(f"timeshare demo: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        say("interrupted; stopping")
        return 130
    finally:
        if stack is not None:
            stop_process(stack, grace=20.0)
