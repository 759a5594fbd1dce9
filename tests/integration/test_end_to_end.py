"""The stack as real processes (`timeshare up`), three synthetic job processes
using only the public client library, and the sim backend's residency record
as the witness that turns never overlapped."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import REPO, forget_simulated_gpus, start_until_ready
from timeshare.activities.backends.sim_memory import sim_state_path
from timeshare.synthetic import SyntheticJobReport, TurnRecord, load_report
from timeshare.testing import free_port, timeshare_command
from timeshare.workers.temporal.dev_server import temporal_binary

JOBS = ["job-0", "job-1", "job-2"]
ITERATIONS = 6  # a sample and a train turn each: 12 turns per job


def read_record(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_three_jobs_take_turns_without_overlap(tmp_path: Path) -> None:
    record_path = tmp_path / "residency.jsonl"
    ports: list[int] = []

    def up_command() -> list[str]:
        ports[:] = [free_port(), free_port(), free_port()]
        return timeshare_command(
            "up", f"--port={ports[0]}", f"--ui-port={ports[1]}", f"--listen=127.0.0.1:{ports[2]}",
            f"--data-dir={tmp_path / 'data'}", "--node=e2e-node", "--sim-state-gib=0.25",
            f"--sim-record={record_path}",
        )  # fmt: skip

    up = start_until_ready(up_command, "timeshare up: ready")
    port, address = ports[0], f"127.0.0.1:{ports[2]}"
    try:
        jobs = [
            subprocess.Popen(
                timeshare_command(
                    "synthetic-job", "--group=e2e", f"--job={job}", f"--address={address}",
                    f"--iterations={ITERATIONS}", "--sample-seconds=0.05",
                    "--reward-seconds=0.05", "--train-seconds=0.05", "--ordering=fifo",
                    f"--report={tmp_path / job}.json",
                ),
                cwd=REPO,
            )
            for job in JOBS
        ]  # fmt: skip
        assert [job.wait(240) for job in jobs] == [0, 0, 0]

        status = subprocess.run(
            timeshare_command("status", "--group", "e2e", f"--address={address}"),
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert "e2e-node=job-" in status.stdout  # residency outlives the jobs
        for command, expected in [
            (["pause", "--group", "e2e"], "paused"),
            (["resume", "--group", "e2e"], "idle"),
            (["drain", "--node", "e2e-node"], "groups told: e2e"),
            (["undrain", "--node", "e2e-node"], "in service"),
            (["evict", "--group", "e2e", "--job", "job-0", "--reason=done"], "evicted job-0"),
        ]:
            result = subprocess.run(
                timeshare_command(*command, f"--address={address}"),
                capture_output=True, text=True, cwd=REPO, timeout=60,
            )  # fmt: skip
            assert result.returncode == 0 and expected in result.stdout, result
        describe = subprocess.run(
            [str(temporal_binary()), "workflow", "describe", "-w", "timeshare-group-e2e",
             "--address", f"localhost:{port}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert describe.returncode == 0, describe.stderr
        assert "GroupWorkflow" in describe.stdout
        # What the simulated GPU held is in memory that outlives the agent
        # but not the machine, as a GPU's is; not in the data directory.
        held = sim_state_path(tmp_path / "data", "e2e-node")
        assert held.exists()
        assert held.parent == tmp_path / "data" or not list((tmp_path / "data").glob("sim-*"))
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
        forget_simulated_gpus(tmp_path / "data", "e2e-node")
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout == "", "processes outlived `timeshare up`"

    reports = [load_report(tmp_path / f"{job}.json") for job in JOBS]
    check_turns(reports, read_record(record_path))


def check_turns(reports: list[SyntheticJobReport], record: list[dict[str, Any]]) -> None:
    turns: list[tuple[str, TurnRecord]] = sorted(
        ((r.spec.job, t) for r in reports for t in r.turns), key=lambda pair: pair[1].epoch
    )
    assert len(turns) == len(JOBS) * ITERATIONS * 2
    # Grants followed arrival order (the group is FIFO): epochs and tickets rise together.
    tickets = [turn.ticket for _, turn in turns]
    assert tickets == sorted(tickets)
    # An epoch is one job's: two turns share it only where the job kept its
    # turn into its next phase (Job.next_turn_nowait), with no wait or switch.
    for (previous_job, previous), (job, turn) in itertools.pairwise(turns):
        if turn.epoch == previous.epoch:
            assert job == previous_job and turn.iteration >= previous.iteration, (previous, turn)
            assert turn.waited_seconds == turn.switch_seconds == 0.0, turn

    # The simulated GPU never held two jobs' state at once.
    assert not [e for e in record if e["event"] == "overlap"]
    resident = sorted((e for e in record if e["event"] == "resident"), key=lambda e: e["start"])
    for earlier, later in itertools.pairwise(resident):
        assert later["start"] >= earlier["end"], (earlier, later)

    # Each hand-over: the previous holder's checkpoint ran after its GPU work
    # ended and finished before the next job was granted.
    checkpoints = [e for e in record if e["event"] == "checkpoint"]
    handovers = 0
    for (previous_job, previous), (job, turn) in itertools.pairwise(turns):
        if job == previous_job:
            continue
        handovers += 1
        assert any(
            c["job"] == previous_job
            and c["start"] >= previous.work_end
            and c["end"] <= turn.granted
            for c in checkpoints
        ), f"epoch {turn.epoch} granted to {job} before {previous_job} was checkpointed"
    assert handovers > 0
