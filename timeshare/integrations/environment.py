"""The job's turns as the environment configures them (see the package's
docstring). Apart from turns.py, which the coordinator builds on, so that
choosing the coordinator's turns does not import back into what it imports."""

from __future__ import annotations

import os

from timeshare.integrations.coordinator import CoordinatedTurns
from timeshare.integrations.exits import leave_at_exit
from timeshare.integrations.turns import ENV_GROUP, ENV_JOB, ENV_TURNS_FD, JobTurns, NoTurns, Turns


def turns_from_env() -> Turns:
    """The job's turns as the environment configures them (see the package's
    docstring): a coordinator's, this process's own, or none. The job leaves
    its group when this process ends (timeshare.integrations.exits)."""
    turns: Turns
    if os.environ.get(ENV_TURNS_FD):
        turns = CoordinatedTurns.from_env()
    elif os.environ.get(ENV_GROUP) and os.environ.get(ENV_JOB):
        turns = JobTurns.join()
    else:
        return NoTurns()
    leave_at_exit(turns.close)
    return turns
