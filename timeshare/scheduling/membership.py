"""Who is in the group: joining, job tokens, leaving and eviction, heartbeats."""

from __future__ import annotations

import hmac

from timeshare.models import HeartbeatOutput
from timeshare.refusals import Refusal
from timeshare.scheduling import ordering
from timeshare.scheduling.base import (
    MAX_JOBS_PER_GROUP,
    MAX_NODES_PER_JOB,
    QueueBase,
    QueueError,
    remember,
)
from timeshare.scheduling.state import JobEntry


class Membership(QueueBase):
    def check_join(self, job: str, nodes: list[str], backfill: bool = False) -> None:
        if backfill and not self.policies:
            raise QueueError(
                Refusal.FAILED_PRECONDITION,
                f"group {self.state.group!r} was created before scheduling policies: "
                "it takes no backfill jobs",
            )
        if not nodes:
            raise QueueError(Refusal.INVALID_ARGUMENT, f"job {job!r} names no nodes")
        if len(nodes) > MAX_NODES_PER_JOB:
            raise QueueError(
                Refusal.INVALID_ARGUMENT,
                f"nodes: at most {MAX_NODES_PER_JOB} per job, got {len(nodes)}",
            )
        if len(set(nodes)) != len(nodes):
            raise QueueError(Refusal.INVALID_ARGUMENT, f"nodes: {nodes} names a node twice")
        entry = self.state.jobs.get(job)
        if entry is None and len(self.state.jobs) >= MAX_JOBS_PER_GROUP:
            raise QueueError(
                Refusal.RESOURCE_EXHAUSTED,
                f"group {self.state.group!r} already has {MAX_JOBS_PER_GROUP} jobs",
            )
        if entry is not None and sorted(entry.nodes) != sorted(nodes) and self._is_active(job):
            raise QueueError(
                Refusal.FAILED_PRECONDITION,
                f"job {job!r} holds or waits for the turn; yield before changing its nodes",
            )

    def join(
        self,
        job: str,
        nodes: list[str],
        token_hash: str,
        now: float,
        weight: float = 1.0,
        priority: int = 0,
        backfill: bool = False,
    ) -> bool:
        """Add or refresh a job; returns True when the job is new. A newcomer's
        share starts level with the least-served member's, so that it cannot
        take the GPU for as long as the others have had it."""
        self.check_join(job, nodes, backfill)
        self._clock = now
        self.state.evicted_jobs.pop(job, None)
        # Back before its agents let its processes go: they need not.
        self.state.releasing.pop(job, None)
        self.state.releasing_incarnation.pop(job, None)
        entry = self.state.jobs.get(job)
        if entry is None:
            self.state.incarnations += 1
            self.state.jobs[job] = JobEntry(
                incarnation=self.state.incarnations,
                nodes=list(nodes),
                token_hash=token_hash,
                joined_at=now,
                last_seen=now,
                weight=weight,
                priority=priority,
                backfill=backfill,
                share_seconds=ordering.level_share(
                    e.share_seconds for e in self.state.jobs.values()
                ),
            )
            return True
        entry.nodes = list(nodes)
        entry.token_hash = token_hash
        entry.last_seen = now
        entry.weight, entry.priority, entry.backfill = weight, priority, backfill
        return False

    def authenticate(self, job: str, token_hash: str) -> JobEntry:
        entry = self.state.jobs.get(job)
        if entry is None:
            reason = self.state.evicted_jobs.get(job)
            if reason is not None:
                raise QueueError(Refusal.ABORTED, f"job {job!r} was evicted: {reason}; join again")
            raise QueueError(
                Refusal.NOT_FOUND, f"job {job!r} is not in group {self.state.group!r}; Join first"
            )
        if hmac.compare_digest(entry.token_hash, token_hash):
            return entry
        owner = self._token_owner(token_hash)
        if owner is not None:
            raise QueueError(
                Refusal.PERMISSION_DENIED,
                f"the job token given belongs to job {owner!r}, not {job!r}; "
                "each job acts only with the token its own Join returned",
            )
        raise QueueError(
            Refusal.UNAUTHENTICATED,
            f"wrong or missing job token for job {job!r}; Join again for one",
        )

    def _token_owner(self, token_hash: str) -> str | None:
        for name, entry in self.state.jobs.items():
            if hmac.compare_digest(entry.token_hash, token_hash):
                return name
        return None

    def touch(self, job: str, now: float) -> None:
        """Any message from a job renews its lease."""
        entry = self.state.jobs.get(job)
        if entry is not None:
            entry.last_seen = max(entry.last_seen, now)

    def leave(self, job: str, now: float) -> None:
        self._remove(job, now, reason="")

    def evict(self, job: str, reason: str, now: float) -> bool:
        """Take a job out of its group; its waiting requests are told ``reason``."""
        if job not in self.state.jobs:
            return False
        self._remove(job, now, reason)
        self.state.evictions += 1
        return True

    def evict_failed(self, job: str, reason: str, now: float) -> None:
        """A job whose state is lost for good (a process's CUDA state FAILED):
        evicted, and left out of the switch under way, so that its retry does
        not act on it again (its agents release what is left of it)."""
        self.evict(job, reason, now)
        plan = self.state.switching
        if plan is not None:
            for move in plan.moves:
                move.evict = [j for j in move.evict if j != job]

    def release_done(self, job: str, node: str, incarnation: int = 0) -> None:
        """The node's agent released the job's processes (or could not be
        reached). The end of an earlier incarnation's release changes nothing:
        the job joined and left again since, and that release is its own."""
        if self.state.releasing_incarnation.get(job, 0) != incarnation:
            return
        nodes = [n for n in self.state.releasing.get(job, []) if n != node]
        if nodes:
            self.state.releasing[job] = nodes
        else:
            self.state.releasing.pop(job, None)
            self.state.releasing_incarnation.pop(job, None)

    def heartbeat(self, job: str, now: float) -> HeartbeatOutput:
        self.touch(job, now)
        turn = self.state.turn
        entry = self.state.jobs[job]
        holding = (turn is not None and turn.job == job) or entry.preempted
        asked = self.yield_requested_epoch(now)
        return HeartbeatOutput(
            holding=holding,
            epoch=self._epoch_known_to(job),
            waiting=len(self.state.queue),
            should_yield=(asked != 0 and turn is not None and turn.job == job)
            if self.policies
            else self._yield_due_reached(now),
            preempted=entry.preempted,
            lease_seconds=self.state.policy.lease_seconds,
        )

    def _remove(self, job: str, now: float, reason: str) -> None:
        if job not in self.state.jobs:
            return
        turn = self.state.turn
        if turn is not None and turn.job == job:
            self._charge(job, turn, now)
            self._end_turn(turn, now, "evicted" if reason else "left")
            self.state.turn = None
            self.state.since = now
        if reason:
            for waiter in self.state.queue:
                if waiter.job == job:
                    remember(self.state.aborted_requests, waiter.request_id, reason)
            remember(self.state.evicted_jobs, job, reason)
        self.state.queue = [w for w in self.state.queue if w.job != job]
        self.state.released.pop(job, None)
        self.state.served_requests.pop(job, None)
        where = set(self.state.jobs[job].nodes)
        where |= {node for node, resident in self.state.resident.items() if resident == job}
        self.state.releasing[job] = sorted(where)
        self.state.releasing_incarnation[job] = self.state.jobs[job].incarnation
        del self.state.jobs[job]
        self._grant_ready(now)

    def _is_active(self, job: str) -> bool:
        turn = self.state.turn
        return (turn is not None and turn.job == job) or any(w.job == job for w in self.state.queue)
