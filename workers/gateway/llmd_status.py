"""How a timeshare group looks through the llm-d orchestrator API: a pure
mapping from our GroupStatus to its GetGroupStatusResponse."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from timeshare.models import GroupStatus
from timeshare.scheduling.base import UNKNOWN_RESIDENT
from timeshare.v1 import llmd_compat_pb2 as llmd

GroupState = llmd.GroupStatus.State
JobState = llmd.SnapshotAgentJobState.State


def group_state(status: GroupStatus) -> GroupState.ValueType:
    if status.state == "degraded":
        return GroupState.STATE_UNKNOWN
    if status.state == "switching":
        return GroupState.STATE_SWITCHING
    if status.state == "held":
        return GroupState.STATE_LOCKED
    if loaded_jobs(status):
        return GroupState.STATE_IDLE_YIELDED
    return GroupState.STATE_IDLE


def loaded_jobs(status: GroupStatus) -> set[str]:
    return {job for job in status.resident.values() if job != UNKNOWN_RESIDENT}


def job_state(status: GroupStatus, node: str, job: str) -> JobState.ValueType:
    incoming = status.switching_to
    incoming_nodes = next((j.nodes for j in status.jobs if j.job == incoming), [])
    resident = status.resident.get(node)
    if incoming and node in incoming_nodes and job in (incoming, resident):
        if status.degraded_cause and f"node {node}:" in status.degraded_cause:
            return JobState.STATE_FAULTED
        return JobState.STATE_TRANSITIONING
    if resident == job:
        return JobState.STATE_RUNNING
    turns = next((j.turns for j in status.jobs if j.job == job), 0)
    return JobState.STATE_SAVED if turns > 0 else JobState.STATE_IDLE


def group_status_response(status: GroupStatus) -> llmd.GetGroupStatusResponse:
    loaded = loaded_jobs(status)
    loaded_job = next(iter(loaded)) if len(loaded) == 1 else ""
    since = Timestamp()
    since.FromNanoseconds(int(status.state_since * 1e9))
    group = llmd.GroupStatus(
        group_id=status.group,
        group_state=group_state(status),
        state_timestamp=since,
        locking_job=status.holder,
        active_job=status.holder or status.switching_to or loaded_job,
        waiter_queue_depth=len(status.queue),
        loaded_job=loaded_job,
    )
    agent_states = [
        llmd.SnapshotAgentJobState(
            agent=node, job_id=job.job, job_state=job_state(status, node, job.job)
        )
        for job in status.jobs
        for node in job.nodes
    ]
    return llmd.GetGroupStatusResponse(group=group, agent_job_states=agent_states)
