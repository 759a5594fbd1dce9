"""timeshare's group and job states mapped onto llm-d's (--llmd-compat).
llm-d's clients taking turns through a gateway:
tests/integration/test_llmd_compat.py."""

from __future__ import annotations

import pytest

from timeshare.models import GroupStatus, JobStatus
from timeshare.workers.gateway.llmd_status import GroupState, JobState, group_status_response


def status_with(**fields: object) -> GroupStatus:
    jobs = [JobStatus(job=j, nodes=["n1"], turns=1, waited_seconds=0, held_seconds=0) for j in "ab"]
    return GroupStatus(group="g", jobs=jobs, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "group_state", "job_states"),
    [
        ({"state": "idle"}, GroupState.STATE_IDLE, [JobState.STATE_SAVED] * 2),
        ({"state": "idle", "resident": {"n1": "a"}}, GroupState.STATE_IDLE_YIELDED,
         [JobState.STATE_RUNNING, JobState.STATE_SAVED]),
        ({"state": "paused", "resident": {"n1": "a"}}, GroupState.STATE_IDLE_YIELDED,
         [JobState.STATE_RUNNING, JobState.STATE_SAVED]),
        ({"state": "held", "holder": "a", "resident": {"n1": "a"}}, GroupState.STATE_LOCKED,
         [JobState.STATE_RUNNING, JobState.STATE_SAVED]),
        ({"state": "switching", "switching_to": "b", "resident": {"n1": "a"}},
         GroupState.STATE_SWITCHING, [JobState.STATE_TRANSITIONING] * 2),
        ({"state": "degraded", "switching_to": "b", "resident": {"n1": "a"},
          "degraded_cause": "node n1: agent down"},
         GroupState.STATE_UNKNOWN, [JobState.STATE_FAULTED] * 2),
    ],
)  # fmt: skip
def test_every_state_maps(
    fields: dict[str, object], group_state: int, job_states: list[int]
) -> None:
    response = group_status_response(status_with(**fields))
    assert response.group.group_state == group_state
    assert [s.job_state for s in response.agent_job_states] == job_states
    expected_active = (
        fields.get("holder")
        or fields.get("switching_to")
        or ("a" if fields.get("resident") else "")
    )
    assert response.group.active_job == expected_active
