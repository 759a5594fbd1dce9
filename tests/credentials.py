"""Job credentials for tests whose agent socket has no scheduler behind it:
the tokens of a few jobs, checked the way the group's record checks them (by
hash), through the agent's own cache. A job's token here is "token-<job>"."""

from __future__ import annotations

import hmac

from timeshare.credentials import JOB_TOKEN_ENV, token_hash
from timeshare.models import TokenCheck
from timeshare.workers.agent.credentials import JobCredentials


def token_of(job: str) -> str:
    return f"token-{job}"


def token_env(job: str) -> dict[str, str]:
    """The environment a launcher gives a worker of ``job``."""
    return {JOB_TOKEN_ENV: token_of(job)}


def known_jobs(group: str = "g") -> JobCredentials:
    """An agent's check to which every job of ``group`` is known, each with its
    own token, and no other group is."""

    async def lookup(asked: str, job: str, digest: str) -> TokenCheck:
        if asked != group:
            return TokenCheck(matches=False, reason=f"group {asked!r} does not exist")
        if not hmac.compare_digest(token_hash(token_of(job)), digest):
            reason = f"wrong or missing job token for job {job!r}"
            return TokenCheck(matches=False, reason=reason, member=True)
        return TokenCheck(matches=True, member=True)

    return JobCredentials(lookup)
