"""What the sim backend's record says about its simulated GPUs' invariant:
one job running on a GPU at a time, and never more state resident than fits.
Tests and benchmarks use it as their witness (``--sim-record FILE``)."""

from __future__ import annotations

import itertools
from typing import Any


def overlaps(record: list[dict[str, Any]]) -> int:
    """Times the simulated GPUs broke their invariant, by the backend's own
    record: two jobs running at once on one GPU (whatever their groups), or
    more resident there than fits."""
    refused = sum(1 for e in record if e["event"] == "overlap")
    broken = 0
    for node, device in {(e["node"], gpu) for e in record for gpu in _devices(e)}:
        mine = [e for e in record if e["node"] == node and device in _devices(e)]
        running = [e for e in mine if e["event"] == "running"]
        broken += sum(
            1
            for a, b in itertools.combinations(running, 2)
            if _job(a) != _job(b) and a["start"] < b["end"] and b["start"] < a["end"]
        )
        broken += overfull([e for e in mine if e["event"] == "resident"])
    return refused + broken


def _devices(event: dict[str, Any]) -> list[str]:
    """The simulated GPUs an event is about; a record written before nodes
    had several is about its group's own one."""
    return list(event.get("devices") or [f"group:{event.get('group')}"])


def _job(event: dict[str, Any]) -> tuple[str, str]:
    return str(event.get("group")), str(event["job"])


def overfull(resident: list[dict[str, Any]]) -> int:
    """Residency intervals that began while the GPU held more than fits: more
    bytes than its capacity, or a second job where it has none (one at a time)."""
    count = 0
    for interval in resident:
        here = [e for e in resident if e["start"] <= interval["start"] < e["end"]]
        # One job's interval recorded twice (an agent restarted) is not two jobs.
        here = list({_job(e): e for e in here}.values())
        capacity = interval.get("capacity")
        if len(here) > 1 and (capacity is None or sum(e.get("bytes", 0) for e in here) > capacity):
            count += 1
    return count
