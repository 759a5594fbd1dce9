"""Groups that span several nodes: three agents as separate processes, three
synthetic job processes each on two of the nodes, and the sim backends'
records of every node as the witness that no node ever held two jobs' state,
that each job's state was on all of its nodes for all of its GPU work, and
that no rank of a job ran while another rank's state was checkpointed."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import timeshare
from timeshare.models import GroupPolicy
from timeshare.synthetic import TurnRecord, load_report
from timeshare.testing import LocalStack, overlaps

GROUP = "multi"
NODES = ["node-a", "node-b", "node-c"]
# Overlapping pairs: every hand-over moves state on two nodes, and one of
# them is always shared with the job before.
JOB_NODES = {
    "job-a": ["node-a", "node-b"],
    "job-b": ["node-b", "node-c"],
    "job-c": ["node-a", "node-b"],
}
ITERATIONS = 5  # a sample and a train turn each: 30 turns, nearly all hand-overs
HANDOVERS = 20


def test_jobs_spanning_nodes_take_turns_without_overlap(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, node=NODES[0], more_nodes=NODES[1:])
    reports = {job: tmp_path / f"{job}.json" for job in JOB_NODES}
    try:
        stack.start_all()
        with timeshare.connect(stack.address) as client:
            # A gate holds the turn until every job waits, so the jobs start
            # together and take turns in the order they queued.
            gate = client.join(GROUP, "gate", nodes=NODES, policy=GroupPolicy(ordering="fifo"))
            gate.acquire()
            jobs = [
                stack.job(
                    GROUP, job, reports[job], f"--iterations={ITERATIONS}",
                    "--sample-seconds=0.1", "--reward-seconds=0.05", "--train-seconds=0.1",
                    nodes=nodes,
                )
                for job, nodes in JOB_NODES.items()
            ]  # fmt: skip
            wait_for_queue(stack, len(JOB_NODES))
            gate.yield_()
            gate.leave()
            assert [job.wait(240) for job in jobs] == [0] * len(JOB_NODES)
    finally:
        stack.stop_all()

    turns = sorted(
        ((job, turn) for job, path in reports.items() for turn in load_report(path).turns),
        key=lambda pair: pair[1].epoch,
    )
    # Every job got all its turns, in the order they were asked for (the group is FIFO).
    assert len(turns) == len(JOB_NODES) * ITERATIONS * 2
    assert len({turn.epoch for _, turn in turns}) == len(turns)
    tickets = [turn.ticket for _, turn in turns]
    assert tickets == sorted(tickets)
    handovers = sum(1 for (a, _), (b, _) in itertools.pairwise(turns) if a != b)
    assert handovers >= HANDOVERS

    record = stack.record()
    assert {e["node"] for e in record if e["event"] == "restore"} == set(NODES)
    assert overlaps(record) == 0
    for job, turn in turns:
        for node in JOB_NODES[job]:
            assert resident_throughout(record, job, node, turn), (job, node, turn)
    for job in JOB_NODES:
        assert ran_during_a_checkpoint(record, job) == [], job


def ran_during_a_checkpoint(record: list[dict[str, Any]], job: str) -> list[tuple[str, str]]:
    """(checkpointed node, running node) where one rank of the job ran on
    while another's state was being checkpointed."""
    running = [e for e in record if e["event"] == "running" and e["job"] == job]
    checkpoints = [e for e in record if e["event"] == "checkpoint" and e["job"] == job]
    return [
        (c["node"], r["node"])
        for c in checkpoints
        for r in running
        if r["start"] < c["start"] < r["end"]
    ]


def wait_for_queue(stack: LocalStack, waiters: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(stack.group(GROUP).queue) < waiters:
        assert time.monotonic() < deadline, f"never saw {waiters} waiters"
        time.sleep(0.05)


def resident_throughout(
    record: list[dict[str, Any]], job: str, node: str, turn: TurnRecord
) -> bool:
    """The job's state was restored on the node before its turn was granted
    and not checkpointed there before its GPU work ended."""
    moves = sorted(
        (e for e in record
         if e["event"] in ("restore", "checkpoint") and e["job"] == job and e["node"] == node),
        key=lambda e: e["start"],
    )  # fmt: skip
    before = [e for e in moves if e["end"] <= turn.granted]
    during = [e for e in moves if e["end"] > turn.granted and e["start"] < turn.work_end]
    return bool(before) and before[-1]["event"] == "restore" and not during
