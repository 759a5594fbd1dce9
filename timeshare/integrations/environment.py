"""The job's turns as the environment configures them (see the package's
docstring). Apart from turns.py, which the coordinator builds on, so that
choosing the coordinator's turns does not import back into what it imports."""

from __future__ import annotations

import os

from timeshare.errors import InvalidArgument
from timeshare.integrations.coordinator import CoordinatedTurns
from timeshare.integrations.exits import leave_at_exit
from timeshare.integrations.turns import ENV_GROUP, ENV_JOB, ENV_TURNS_FD, JobTurns, NoTurns, Turns


def turns_from_env() -> Turns:
    """The job's turns as the environment configures them (see the package's
    docstring): a coordinator's, this process's own, or none. The job leaves
    its group when this process ends (timeshare.integrations.exits).

    One of TIMESHARE_GROUP and TIMESHARE_JOB without the other is an error
    that names the missing one: a job meant to take turns would otherwise run
    as if timeshare were absent, and nobody would know why it never waits."""
    turns: Turns
    if os.environ.get(ENV_TURNS_FD):
        turns = CoordinatedTurns.from_env()
    elif os.environ.get(ENV_GROUP) and os.environ.get(ENV_JOB):
        turns = JobTurns.join()
    elif os.environ.get(ENV_GROUP) or os.environ.get(ENV_JOB):
        raise InvalidArgument(half_configured())
    else:
        return NoTurns()
    leave_at_exit(turns.close)
    return turns


def half_configured() -> str:
    """What to say when only one of the two variables is set."""
    given, missing = (ENV_GROUP, ENV_JOB) if os.environ.get(ENV_GROUP) else (ENV_JOB, ENV_GROUP)
    return (
        f"{given} is set ({os.environ[given]!r}) but {missing} is not: set both for this job "
        "to take turns in its group, or neither to run it without timeshare"
    )
