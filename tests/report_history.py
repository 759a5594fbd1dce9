"""A group history recorded by hand for the report tests: three jobs on two
nodes, one failed switch retried, and a turn still held at capture."""

from __future__ import annotations

from timeshare.history import GroupHistory, SwitchRecord, TurnRecord

T = 1_700_000_000.0
GIB = 2**30
JOBS = ("job-a", "job-b", "job-c")
NODES = ("node-a", "node-b")


def _switch(
    node: str,
    epoch: int,
    start: float,
    finish: float,
    evicted: list[str],
    admitted: str,
    gib: int,
    ok: bool = True,
    error: str = "",
) -> SwitchRecord:
    return SwitchRecord(
        node=node,
        epoch=epoch,
        started_at=T + start,
        finished_at=T + finish,
        evicted=evicted,
        admitted=admitted,
        bytes_moved=gib * GIB,
        backend="sim",
        ok=ok,
        error=error,
    )


def recorded_history() -> GroupHistory:
    turns = [
        TurnRecord(
            job="job-a",
            epoch=1,
            requested_at=T,
            granted_at=T + 0.5,
            released_at=T + 3,
            switch_seconds=0.5,
        ),
        TurnRecord(
            job="job-b",
            epoch=2,
            requested_at=T + 1,
            granted_at=T + 4,
            released_at=T + 6,
            switch_seconds=1.0,
            ended_by="preempted",
        ),
        TurnRecord(
            job="job-c",
            epoch=3,
            requested_at=T + 2,
            granted_at=T + 8.5,
            released_at=T + 10,
            switch_seconds=2.5,
        ),
        # Still holding when the history was read.
        TurnRecord(job="job-a", epoch=4, requested_at=T + 5, granted_at=T + 11, switch_seconds=1.0),
    ]
    switches = [
        _switch("node-a", 1, 0, 0.5, [], "job-a", 2),
        _switch("node-b", 1, 0, 0.4, [], "job-a", 2),
        _switch("node-a", 2, 3, 4, ["job-a"], "job-b", 4),
        _switch("node-b", 2, 3, 3.8, ["job-a"], "job-b", 4),
        _switch("node-a", 3, 6, 7, ["job-b"], "job-c", 4),
        _switch("node-b", 3, 6, 6.5, ["job-b"], "job-c", 1, ok=False, error="restore timed out"),
        _switch("node-b", 3, 7.5, 8.5, [], "job-c", 2),
        _switch("node-a", 4, 10, 11, ["job-c"], "job-a", 4),
        _switch("node-b", 4, 10, 10.8, ["job-c"], "job-a", 4),
    ]
    return GroupHistory(group="pair", captured_at=T + 14, turns=turns, switches=switches)
