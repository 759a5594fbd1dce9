"""The node agent's check of a job credential: a process joins a job's switches
(registers into it, serves its hooks) only by presenting that job's token.

On a node shared by tenants, any process that can reach the agent's socket
could otherwise name any job: serve hooks that fail every switch moving it,
inflate its footprint, or sit in its freeze set. The agent hashes the token
as the gateway does (timeshare.credentials.token_hash) and asks the group's
workflow whether the hash is the job's (the ``token_matches`` query: no
history, no state). Tokens are never kept, only their hashes, and only for
checks that passed: a restart of a job's many ranks costs one query, not one
per rank. A refusal is not remembered, so a job that has just joined can
register at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from timeshare.activities.backends.processes import NotPermitted, RegistrationRefused
from timeshare.credentials import JOB_TOKEN_ENV, token_hash
from timeshare.models import JobToken, TokenCheck
from timeshare.names import group_workflow_id
from timeshare.workflows.group import GroupWorkflow

# How long a check that passed holds: a job that joins again gets a new
# token, and the old one goes on admitting its processes for at most this long.
VERIFIED_SECONDS = 60.0
# Checks remembered at most (expired ones are dropped first).
MAX_VERIFIED = 4096
QUERY_SECONDS = 10.0

# (group, job, token hash) -> whether it is the job's, and why not.
Lookup = Callable[[str, str, str], Awaitable[TokenCheck]]
Key = tuple[str, str, str]


class CredentialUnverifiable(RegistrationRefused):
    """The check itself could not be made now (the scheduler is unreachable)."""

    code = "UNAVAILABLE"


class JobCredentials:
    def __init__(
        self,
        lookup: Lookup,
        verified_seconds: float = VERIFIED_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self._verified_seconds = verified_seconds
        self._clock = clock
        self._verified: dict[Key, float] = {}
        # One lookup in flight per key: ranks that register together share it.
        self._pending: dict[Key, asyncio.Future[TokenCheck]] = {}

    async def verify(self, group: str, job: str, token: str) -> None:
        """Return if ``token`` is the job's; else NotPermitted (or
        CredentialUnverifiable) with one line that says why."""
        if not token:
            raise NotPermitted(
                f"job {group}/{job}: no job token given; a process joins a job's switches only "
                f"with the token its Join returned (job.token, {JOB_TOKEN_ENV}, or --token)"
            )
        key = (group, job, token_hash(token))
        if self._verified.get(key, 0.0) > self._clock():
            return
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._ask(key))
            self._pending[key] = pending
            pending.add_done_callback(lambda done: self._settled(key, done))
        # Shielded: a caller that hangs up does not cancel the others' lookup.
        verdict = await asyncio.shield(pending)
        if not verdict.matches:
            raise NotPermitted(f"job {group}/{job}: {verdict.reason}")
        self._remember(key)

    async def verify_release(self, group: str, job: str, token: str) -> None:
        """May a non-root owner of the job's processes here release them by hand
        (`timeshare forget`)? Once the job has left its group, yes: that is what
        the command is for. While it is in its group, only with its token: where
        tenants share a user id, owning the processes proves nothing."""
        if token:
            await self.verify(group, job, token)
            return
        verdict = await self._ask((group, job, token_hash(token)))
        if verdict.member:
            raise NotPermitted(
                f"job {group}/{job} is still in its group: releasing its processes by hand "
                f"takes root or the job's token ({JOB_TOKEN_ENV} or --token)"
            )

    def _settled(self, key: Key, done: asyncio.Future[TokenCheck]) -> None:
        self._pending.pop(key, None)
        if not done.cancelled():
            done.exception()  # seen here, even if every caller has gone

    async def _ask(self, key: Key) -> TokenCheck:
        group, job, digest = key
        try:
            return await asyncio.wait_for(self._lookup(group, job, digest), QUERY_SECONDS)
        except RegistrationRefused:
            raise
        except Exception as error:
            raise CredentialUnverifiable(
                f"job {group}/{job}: cannot check its token with the scheduler now "
                f"({type(error).__name__}: {error}); try again"
            ) from None

    def _remember(self, key: Key) -> None:
        now = self._clock()
        if len(self._verified) >= MAX_VERIFIED:
            for stale in [k for k, until in self._verified.items() if until <= now]:
                del self._verified[stale]
            while len(self._verified) >= MAX_VERIFIED:
                del self._verified[next(iter(self._verified))]
        self._verified[key] = now + self._verified_seconds


def group_lookup(client: Client) -> Lookup:
    """Ask the group's workflow (GroupWorkflow.token_matches)."""

    async def lookup(group: str, job: str, digest: str) -> TokenCheck:
        handle = client.get_workflow_handle_for(GroupWorkflow.run, group_workflow_id(group))
        try:
            return await handle.query(
                GroupWorkflow.token_matches, JobToken(job=job, token_hash=digest)
            )
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                reason = f"group {group!r} does not exist; Join first"
                return TokenCheck(matches=False, reason=reason)
            raise
        except WorkflowQueryFailedError as error:
            # A scheduler from before this check knows no such query.
            raise CredentialUnverifiable(
                f"job {group}/{job}: the scheduler cannot check job tokens ({error}); "
                "upgrade the scheduler workers"
            ) from None

    return lookup
