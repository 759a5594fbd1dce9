"""What the chaos run's jobs saw, from their own records.

- turn: a grant the job later yielded and the scheduler recorded the yield;
- lost: an acquire of a job process that was never killed and that never
  returned a grant: still blocked when the run gave up waiting, or ended by
  an error (a killed job's pending acquire is not lost: the fault ended it);
- double grant: two jobs of one group holding at once, by the jobs' own
  intervals from the acquire returning to the yield being sent (a killed
  job's interval ends when it was killed), or one epoch granted twice;
- error: any other call of a live job that failed (join, yield, leave).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class JobRecord:
    """What one process of a job wrote (see `bench.parts.chaos_job`), and when the run killed it."""

    group: str
    job: str
    events_path: Path
    killed_at: float | None = None

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        events = []
        for line in self.events_path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                break  # cut short by a SIGKILL
        return events


@dataclass
class Holding:
    job: str
    epoch: int
    start: float
    end: float


def turns_completed(processes: Sequence[JobRecord]) -> int:
    return sum(1 for p in processes for e in p.events() if e["event"] == "yielded")


def grant_times(processes: Sequence[JobRecord]) -> list[float]:
    return sorted(e["at"] for p in processes for e in p.events() if e["event"] == "granted")


def lost(processes: Sequence[JobRecord]) -> list[str]:
    """The job processes whose last acquire was lost, with what they last said."""
    found = []
    for p in processes:
        if p.killed_at is not None:
            continue
        events = p.events()
        asked = [i for i, e in enumerate(events) if e["event"] == "requested"]
        if not asked:
            continue
        after = events[asked[-1] + 1 :]
        if not after or after[0]["event"] == "error":
            said = after[0]["message"] if after else "no answer"
            found.append(f"{p.group}/{p.job}: {said}")
    return found


def errors(processes: Sequence[JobRecord]) -> list[str]:
    """Failed calls of live jobs other than acquires (those count as lost)."""
    found = []
    for p in processes:
        events = p.events()
        for before, event in itertools.pairwise(events):
            if event["event"] == "error" and before["event"] != "requested":
                found.append(f"{p.group}/{p.job} after {before['event']}: {event['message']}")
        if events and events[0]["event"] == "error":
            found.append(f"{p.group}/{p.job} at start: {events[0]['message']}")
    return found


def holdings(process: JobRecord, run_end: float) -> list[Holding]:
    held, open_grant = [], None
    for event in process.events():
        if event["event"] == "granted":
            open_grant = event
        elif event["event"] == "yielding" and open_grant is not None:
            held.append(Holding(process.job, open_grant["epoch"], open_grant["at"], event["at"]))
            open_grant = None
    if open_grant is not None:
        end = process.killed_at if process.killed_at is not None else run_end
        held.append(Holding(process.job, open_grant["epoch"], open_grant["at"], end))
    return held


def double_grants(processes: Sequence[JobRecord], run_end: float) -> list[str]:
    by_group: defaultdict[str, list[Holding]] = defaultdict(list)
    for p in processes:
        by_group[p.group] += holdings(p, run_end)
    found = []
    for group, held in sorted(by_group.items()):
        held.sort(key=lambda h: h.start)
        latest: Holding | None = None
        for h in held:
            if latest is not None and h.start < latest.end:
                found.append(
                    f"{group}: {h.job} (epoch {h.epoch}) granted while "
                    f"{latest.job} (epoch {latest.epoch}) held"
                )
            if latest is None or h.end > latest.end:
                latest = h
        epochs = Counter(h.epoch for h in held)
        found += [f"{group}: epoch {e} granted {n} times" for e, n in epochs.items() if n > 1]
    return found


def recovery_seconds(fault_times: list[float], grants: list[float]) -> list[float]:
    """From each fault to the next grant in any group (faults never followed by one: left out)."""
    found = []
    for at in fault_times:
        after = [g for g in grants if g > at]
        if after:
            found.append(min(after) - at)
    return found
