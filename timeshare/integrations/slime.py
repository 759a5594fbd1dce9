"""A Slime phase callback: the trainer and sampler pools take turns.

Slime (THUDM/slime) has no phase hook upstream. llm-d's time-slicing adds one
in a Slime fork: ``--phase-callback-path module.Class`` loads a class of
``slime.utils.phase_callback.PhaseCallback``'s shape and calls
``on_phase_begin(phase, role, context)`` / ``on_phase_end(phase, role,
context)`` around each GPU phase of train.py and train_async.py, with roles
"trainer", "sampler" and "both" (llm-d-incubation/llm-d-rl-time-slicing,
pkg/integrations/slime/timeslice_slime/callback.py). A setup that used
llm-d's callback switches by changing that one path:

    --phase-callback-path timeshare.integrations.slime.TimeshareCallback

Roles map to groups as llm-d's do: "trainer" to the trainer pool's group,
"sampler" to the sampler pool's, "both" (init, weight sync) to both. The
environment names the job and the groups; llm-d's variables are read where
timeshare's are unset, so the same job spec works:

    TIMESHARE_JOB            (TIMESLICE_JOB_ID)         the job
    TIMESHARE_TRAINER_GROUP  (TIMESLICE_TRAINER_GROUP)  the trainer pool's group
    TIMESHARE_SAMPLER_GROUP  (TIMESLICE_SAMPLER_GROUP)  the sampler pool's group
    TIMESHARE_ADDRESS        (TIMESLICE_ORCH_ADDR)      the gateway

With any of the first three unset the callback does nothing. The two groups
may be the same (trainer and sampler colocated on one pool): one turn then
covers both roles.

Deadlock-free for any phase order and any naming of the groups: a job waits
for a group only while it holds none that comes after it in the one order
every job uses (by group name, timeshare._protocol.acquisition_order). A
phase that needs a group earlier in that order than one the job holds (in
train_async.py the next ``generate`` begins inside ``train``, and with
llm-d's names ``samplers-…`` comes before ``trainers-…``) gives back what the
job holds and takes it all again in that order: if nobody waits, nothing
moves. A group is given back when the last phase open in it ends, so an
``eval`` that ends while the next ``generate`` still runs on the sampler pool
(train_async.py) keeps that pool.

The callback runs in Slime's driver, which is never stopped: the pools' GPU
processes (Megatron actors, SGLang servers) register with their nodes'
agents (`timeshare register --group G --job J --pid PID` from the pod or
launcher, or `timeshare.registration.register_process` inside the process),
each with the token of its pool's group's job (TIMESHARE_JOB_TOKEN; the
driver's joined jobs carry them as ``.token``): the agents admit no process
into a job without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter
from typing import Any

from timeshare._protocol import acquisition_order
from timeshare.client import Client, Job
from timeshare.integrations.exits import leave_at_exit

log = logging.getLogger("timeshare.integrations.slime")
TRAINER, SAMPLER, BOTH = "trainer", "sampler", "both"
# timeshare's variable first, then llm-d's.
ENVIRONMENT = {
    "job": ("TIMESHARE_JOB", "TIMESLICE_JOB_ID"),
    "trainer": ("TIMESHARE_TRAINER_GROUP", "TIMESLICE_TRAINER_GROUP"),
    "sampler": ("TIMESHARE_SAMPLER_GROUP", "TIMESLICE_SAMPLER_GROUP"),
    "address": ("TIMESHARE_ADDRESS", "TIMESLICE_ORCH_ADDR"),
}


def from_env(what: str) -> str | None:
    return next((os.environ[v] for v in ENVIRONMENT[what] if os.environ.get(v)), None)


def roles_of(role: str) -> tuple[str, ...]:
    if role == BOTH:
        return (TRAINER, SAMPLER)
    if role in (TRAINER, SAMPLER):
        return (role,)
    raise ValueError(f"unknown Slime role {role!r}: expected trainer, sampler or both")


class RoleTurns:
    """A job's turns in its trainer and sampler groups, by role."""

    def __init__(
        self, jobs: dict[str, Job], client: Client | None = None,
        acquire_timeout: float | None = None,
    ) -> None:  # fmt: skip
        # role -> the job's handle in that role's group (one handle if both share a group)
        self.jobs = jobs
        self._client = client
        self._timeout = acquire_timeout
        self._held: set[str] = set()  # groups
        self._open: Counter[str] = Counter()  # group -> phases begun and not ended in it
        self._closed = False

    @classmethod
    def from_env(cls, address: str | None = None) -> RoleTurns | None:
        job, trainer, sampler = from_env("job"), from_env("trainer"), from_env("sampler")
        if not (job and trainer and sampler):
            missing = [ENVIRONMENT[w][0] for w in ("job", "trainer", "sampler") if not from_env(w)]
            log.warning(
                "timeshare: Slime callback inactive: %s not set (set TIMESHARE_JOB, "
                "TIMESHARE_TRAINER_GROUP and TIMESHARE_SAMPLER_GROUP)",
                " and ".join(missing),
            )
            return None
        client = Client(address or from_env("address"))
        handles = {group: client.join(group, job) for group in dict.fromkeys((trainer, sampler))}
        turns = cls({TRAINER: handles[trainer], SAMPLER: handles[sampler]}, client)
        # Slime calls close() only after a loop that ended well.
        leave_at_exit(turns.close)
        return turns

    def groups(self, role: str) -> list[str]:
        return list(dict.fromkeys(self.jobs[r].group for r in roles_of(role)))

    def _job(self, group: str) -> Job:
        return next(job for job in self.jobs.values() if job.group == group)

    def held(self, role: str) -> bool:
        return all(group in self._held for group in self.groups(role))

    def begin(self, phase: str, role: str) -> None:
        groups = self.groups(role)
        wanted = [group for group in groups if group not in self._held]
        if wanted:
            self._take(wanted, phase)
        self._open.update(groups)

    def _take(self, wanted: list[str], phase: str) -> None:
        if self._held and min(wanted) < max(self._held):
            # Waiting for it now could close a cycle: give back, then take
            # everything in the one order.
            held = sorted(self._held)
            for group in reversed(held):
                self._job(group).yield_()
                self._held.discard(group)
            wanted = [*wanted, *held]
        for job in acquisition_order([self._job(group) for group in wanted]):
            job.acquire(self._timeout, phase=phase)
            self._held.add(job.group)

    def end(self, phase: str, role: str) -> None:
        for group in self.groups(role):
            self._open[group] = max(0, self._open[group] - 1)
        done = [g for g in self.groups(role) if g in self._held and not self._open[g]]
        for group in sorted(done, reverse=True):
            self._job(group).yield_()
            self._held.discard(group)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Leaving gives back whatever is held; a failed release must not keep the job in.
        for group in sorted(self._held, reverse=True):
            with contextlib.suppress(Exception):
                self._job(group).yield_()
        self._held.clear()
        for job in dict.fromkeys(self.jobs.values()):
            job.leave()
        if self._client is not None:
            self._client.close()


def _phase_callback_base() -> type[Any]:
    """Slime's PhaseCallback where the installed Slime has one, else ``object``:
    Slime calls the methods by name."""
    try:
        from slime.utils.phase_callback import PhaseCallback
    except ImportError:
        return object
    base: type[Any] = PhaseCallback
    return base


class TimeshareCallback(_phase_callback_base()):  # type: ignore[misc]
    """Slime's phase callback (see the module's docstring)."""

    def __init__(self, turns: RoleTurns | None = None) -> None:
        self.turns = turns if turns is not None else RoleTurns.from_env()

    def on_phase_begin(self, phase: str, role: str, context: Any = None) -> None:
        if self.turns is not None:
            self.turns.begin(phase, role)

    def on_phase_end(self, phase: str, role: str, context: Any = None) -> None:
        if self.turns is not None:
            self.turns.end(phase, role)

    def close(self) -> None:
        if self.turns is not None:
            self.turns.close()
            self.turns = None
