"""Job credentials: how a job token is hashed for the scheduler's record, the
per-job token llm-d compatibility derives, and which token a process presents
to its node agent when it registers or serves hooks.

Join returns a job token; the group's record keeps only its SHA-256. A node
agent lets a process join a job's switches (register, serve hooks) only when
the process presents that token. A process finds it, in this order: given
explicitly, from a Join made by this very process, or from the environment
(TIMESHARE_JOB_TOKEN, which a launcher sets for the job's workers).

Not TIMESHARE_TOKEN: that is the gateway's bearer token (who may call the
gateway at all), and presenting it to the agent would only be refused."""

from __future__ import annotations

import hashlib
import hmac
import os
import threading

JOB_TOKEN_ENV = "TIMESHARE_JOB_TOKEN"

_joined: dict[tuple[str, str], str] = {}
_joined_lock = threading.Lock()


def token_hash(token: str) -> str:
    """What the group's record keeps of a job token (the gateway and the
    agents hash alike, so that the agent's check meets the gateway's record)."""
    return hashlib.sha256(token.encode()).hexdigest()


def llmd_job_token(secret: bytes, group: str, job: str) -> str:
    """The job token llm-d compatibility holds for ``job`` of ``group``: its
    clients carry none, so the gateway derives one from its secret
    (TIMESHARE_LLMD_SECRET). The same derivation gives an operator the job's
    credential for its node agent, without handing the job the secret itself,
    which would let it derive every other llm-d job's."""
    return hmac.new(secret, f"{group}/{job}".encode(), "sha256").hexdigest()


def remember_job_token(group: str, job: str, token: str) -> None:
    """A Join made by this process: its processes' registrations use the token."""
    with _joined_lock:
        _joined[(group, job)] = token


def job_token(group: str, job: str, token: str | None = None) -> str:
    """The token this process presents for ``job`` of ``group`` ("" if it has none)."""
    if token:
        return token
    with _joined_lock:
        joined = _joined.get((group, job))
    return joined or os.environ.get(JOB_TOKEN_ENV, "")
