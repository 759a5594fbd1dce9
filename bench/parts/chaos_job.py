"""One job of the chaos run (`bench.chaos`): turns until a deadline, then it
finishes the turn it is waiting for and leaves. Every step is appended to a
JSON-lines file the moment it happens, so a SIGKILL loses nothing the job had
done and the run can tell what a job was waiting for when it ended.

    python -m bench.parts.chaos_job --group G --job J --nodes a,b --events PATH --until UNIX_TIME
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import IO, Any

import timeshare
from timeshare.errors import TimeshareError, Unavailable
from timeshare.models import GroupPolicy

# A job may be (re)started while the gateway or Temporal is down.
JOIN_RETRY_SECONDS = 300.0


class EventLog:
    def __init__(self, path: Path) -> None:
        # Line-buffered: each event reaches the kernel before the next step.
        self._file: IO[str] = path.open("a", buffering=1)

    def add(self, event: str, **fields: Any) -> None:
        self._file.write(json.dumps({"event": event, "at": time.time(), **fields}) + "\n")


def join_afresh(
    client: timeshare.Client, group: str, job: str, nodes: list[str], policy: GroupPolicy
) -> timeshare.Job:
    """Join, dropping whatever a killed process of the same name left (its turn
    or its place in the queue), and join again."""
    deadline = time.monotonic() + JOIN_RETRY_SECONDS
    while True:
        try:
            client.join(group, job, nodes=nodes, policy=policy).leave()
            return client.join(group, job, nodes=nodes, policy=policy)
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def run(args: argparse.Namespace, events: EventLog) -> None:
    policy = GroupPolicy(
        lease_seconds=args.lease_seconds,
        agent_timeout_seconds=args.agent_timeout_seconds,
        continue_as_new_every=args.continue_as_new_every,
        gpus=[int(gpu) for gpu in args.gpus.split(",") if gpu],
    )
    with timeshare.connect(args.address) as client:
        job = join_afresh(client, args.group, args.job, args.nodes.split(","), policy)
        events.add("joined")
        while time.time() < args.until:
            events.add("requested")
            turn = job.acquire()
            events.add("granted", epoch=turn.epoch, ticket=turn.ticket)
            time.sleep(args.work_seconds)  # stands for the GPU work of the turn
            events.add("yielding")
            job.yield_()
            events.add("yielded")
            time.sleep(args.gap_seconds)
        job.leave()
        events.add("left")


def main() -> int:
    parser = argparse.ArgumentParser(description="One job of the chaos run.")
    parser.add_argument("--group", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--nodes", required=True, help="comma-separated")
    parser.add_argument("--address", required=True, help="gateway HOST:PORT")
    parser.add_argument("--events", type=Path, required=True, help="JSON lines, appended")
    parser.add_argument("--until", type=float, required=True, help="no new turn after (Unix time)")
    parser.add_argument("--work-seconds", type=float, default=0.3)
    parser.add_argument("--gap-seconds", type=float, default=0.2)
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    parser.add_argument("--agent-timeout-seconds", type=float, default=30.0)
    parser.add_argument("--continue-as-new-every", type=int, default=0, help="grants")
    parser.add_argument("--gpus", default="", help="the GPUs the group uses on each node")
    args = parser.parse_args()
    events = EventLog(args.events)
    try:
        run(args, events)
    except TimeshareError as error:
        events.add("error", message=str(error))
        print(f"chaos job {args.job}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
