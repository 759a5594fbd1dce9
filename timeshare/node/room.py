"""Co-residency, as a node's agent plans it for each switch: which jobs must
leave the device so that the next one fits, and which may stay there,
locked. Plain data in, a decision out (the placement advisor's device model
plans with it too)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from timeshare.models import DeviceBytes


class RoomPlan(BaseModel):
    # Checkpoint these, least recently used first.
    evict: list[str]
    # Lock these: their state stays on the device beside the admitted job.
    keep: list[str]


def extra(admitted: DeviceBytes | None, now: DeviceBytes | None) -> DeviceBytes | None:
    """What a job's admission adds on each device, beyond what it holds there now."""
    if admitted is None or now is None:
        return None
    return {device: count - now.get(device, 0) for device, count in admitted.items()}


def fits(need: DeviceBytes, free: DeviceBytes) -> bool:
    return all(count <= free.get(device, 0) for device, count in need.items())


def plan_room(
    need: DeviceBytes | None,
    free: DeviceBytes | None,
    least_recent_first: list[str],
    footprints: Mapping[str, DeviceBytes | None],
) -> RoomPlan:
    """Evict, least recently used first, only until ``need`` fits in what is
    free. Where either figure is unknown, evict every job: never guess. A job
    of unknown size always leaves: nobody can tell what it holds or may take."""
    if need is None or free is None:
        return RoomPlan(evict=list(least_recent_first), keep=[])
    room = dict(free)
    evict = [job for job in least_recent_first if footprints.get(job) is None]
    for job in least_recent_first:
        if job in evict:
            continue
        if fits(need, room):
            break
        evict.append(job)
        for device, count in (footprints.get(job) or {}).items():
            room[device] = room.get(device, 0) + count
    return RoomPlan(
        evict=[job for job in least_recent_first if job in evict],
        keep=[job for job in least_recent_first if job not in evict],
    )
