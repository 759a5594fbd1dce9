"""What time alone decides: leases running out, the turn limit, preemption."""

from __future__ import annotations

from timeshare.scheduling import backfill, ordering, switch_costs
from timeshare.scheduling.base import (
    QueueBase,
)
from timeshare.scheduling.state import StoredGrant, Waiter

# The kinds of lease a job may run out of (see Deadlines._lease_deadlines).
LEGACY, IDLE, HELD = "legacy", "idle", "held"


class Deadlines(QueueBase):
    def next_deadline(self, now: float | None = None) -> float | None:
        """When expire() next has something to do, or the holder is next asked
        to yield, if nothing else happens first."""
        deadlines = [deadline for _, deadline, _ in self._lease_deadlines()]
        if self.state.anticipation is not None:
            deadlines.append(self.state.anticipation.until)
        asked, preempt_at = self._yield_times()
        if preempt_at is not None:
            deadlines.append(preempt_at)
        if self.policies and asked is not None and (now is None or asked > now):
            deadlines.append(asked)  # the request to yield is published then
        held_back_until = switch_costs.recheck_at(self.state, self._clock if now is None else now)
        if held_back_until is not None:
            deadlines.append(held_back_until)
        return min(deadlines) if deadlines else None

    def expire(self, now: float) -> list[str]:
        """Evict jobs whose lease ran out and preempt a holder past its time; say what was done."""
        self._clock = max(self._clock, now)
        done = []
        if not self.policies:
            lease = self.state.policy.lease_seconds
            for job, entry in list(self.state.jobs.items()):
                if now - entry.last_seen >= lease:
                    self.evict(job, f"its lease expired (no heartbeat for {lease:g} s)", now)
                    done.append(f"evicted {job}: lease expired")
        else:
            for job, deadline, kind in self._lease_deadlines():
                if now >= deadline and job in self.state.jobs:
                    reason = self._lease_reason(kind)
                    self.evict(job, reason, now)
                    done.append(f"evicted {job}: {reason}")
        held = self.state.anticipation
        if held is not None and self._anticipated(now) is None:
            done.append(f"held the turn for {held.job} in vain")
            self._grant_ready(now)
        turn = self.state.turn
        _, preempt_at = self._yield_times()
        if turn is not None and preempt_at is not None and now >= preempt_at:
            entry = self.state.jobs[turn.job]
            if entry.backfill and backfill.moved_only_by_hooks(entry, self.state.recent_switches):
                reason = backfill.eviction_reason(self.state.policy.backfill_grace_seconds)
                self.evict(turn.job, reason, now)
                self.state.backfill_preemptions += 1
                done.append(f"evicted backfill job {turn.job}: {reason}")
                return done
            self._preempt(turn, now)
            done.append(f"preempted {turn.job} after {now - turn.granted_at:.0f} s")
        return done

    def yield_requested_epoch(self, now: float) -> int:
        """The epoch whose holder is asked to yield now (0: none): others wait
        past its turn limit, or a waiter outranks it."""
        turn = self.state.turn
        asked, _ = self._yield_times()
        if turn is None or asked is None or now < asked:
            return 0
        return turn.resumes_epoch or turn.epoch

    def _lease_deadlines(self) -> list[tuple[str, float, str]]:
        """(job, when its lease runs out, why it would be evicted then). A
        holder that others wait for must be heard from within lease_seconds
        of their first request or of its grant, whichever is later; everyone
        else within idle_lease_seconds.
        (Groups from before policies: everyone within lease_seconds.) The
        reason is a kind here (LEGACY, IDLE or HELD), worded at eviction."""
        policy = self.state.policy
        if not self.policies:
            return [
                (job, e.last_seen + policy.lease_seconds, LEGACY)
                for job, e in self.state.jobs.items()
            ]
        turn = self.state.turn
        idle = policy.idle_lease
        contended: float | None = None
        if turn is not None and turn.job in self.state.jobs:
            others = [w.since for w in self.state.queue if w.job != turn.job]
            if others:
                since = max(self.state.jobs[turn.job].last_seen, min(others))
                # A job granted after a long wait had nothing to say while
                # it waited: it gets the whole lease from its grant.
                since = max(since, turn.granted_at)
                contended = since + policy.lease_seconds
        deadlines = []
        for job, entry in self.state.jobs.items():
            deadline = entry.last_seen + idle
            if (
                contended is not None
                and turn is not None
                and job == turn.job
                and contended < deadline
            ):
                deadlines.append((job, contended, HELD))
                continue
            deadlines.append((job, deadline, IDLE))
        return deadlines

    def _lease_reason(self, kind: str) -> str:
        policy = self.state.policy
        if kind == HELD:
            return (
                f"it held the turn while others waited and sent nothing for "
                f"{policy.lease_seconds:g} s"
            )
        if kind == IDLE:
            return f"it sent nothing for {policy.idle_lease:g} s"
        return f"its lease expired (no heartbeat for {policy.lease_seconds:g} s)"

    def _yield_times(self) -> tuple[float | None, float | None]:
        """When the holder is (or was) asked to yield, and when it is
        preempted: the turn limit with others waiting, or a waiter that
        outranks it (preempt_lower_after_seconds), or a regular job waiting
        for a backfill holder (asked at once; preempted after
        backfill_grace_seconds: scheduling/backfill.py)."""
        turn = self.state.turn
        if turn is None:
            return None, None
        policy = self.state.policy
        asked: list[float] = []
        preempt: list[float] = []
        limit_due = self._turn_limit_due()
        if limit_due is not None:
            asked.append(limit_due)
            preempt.append(limit_due + policy.preempt_grace_seconds)
        if turn.kept_past_others_at:
            asked.append(turn.kept_past_others_at)
        if self.policies and policy.preempt_lower_after_seconds > 0:
            outranked = self._outranked_from(turn)
            if outranked is not None:
                asked.append(outranked)
                preempt.append(outranked + policy.preempt_lower_after_seconds)
        regular_asked = backfill.asked_to_yield_from(turn, self.state.jobs, self._eligible())
        if regular_asked is not None:
            asked.append(regular_asked)
            preempt.append(regular_asked + policy.backfill_grace_seconds)
        ahead = switch_costs.yield_ahead_at(self.state, turn)
        if ahead is not None:
            asked.append(ahead)  # not preempted for it: no regular job waits yet
        return min(asked, default=None), min(preempt, default=None)

    def _outranked_from(self, turn: StoredGrant) -> float | None:
        policy, jobs = self.state.policy, self.state.jobs
        holder = ordering.holder_priority(jobs[turn.job], turn, policy)
        times = [
            ordering.outranks_holder_from(waiter, jobs[waiter.job], holder, policy)
            for waiter in backfill.contenders(turn, jobs, self._eligible())
            if waiter.job != turn.job
        ]
        return min((t for t in times if t is not None), default=None)

    def _turn_limit_due(self) -> float | None:
        """When the holder was (or will be) first asked to yield for its turn
        limit: past the limit with someone waiting."""
        turn = self.state.turn
        limit = self.state.policy.max_turn_seconds
        if turn is None or limit <= 0:
            return None
        eligible = backfill.contenders(turn, self.state.jobs, self._eligible())
        if not eligible:
            return None
        return max(turn.granted_at + limit, eligible[0].since)

    def _yield_due_reached(self, now: float) -> bool:
        due = self._turn_limit_due()
        return due is not None and now >= due

    def _preempt(self, turn: StoredGrant, now: float) -> None:
        entry = self.state.jobs[turn.job]
        self._charge(turn.job, turn, now)
        entry.preempted = True
        self._end_turn(turn, now, "preempted")
        self.state.turn = None
        self.state.since = now
        self.state.preemptions += 1
        self.state.backfill_preemptions += entry.backfill
        self.state.queue.append(
            Waiter(
                job=turn.job,
                request_id=f"{turn.request_id}/resume-{turn.epoch}",
                ticket=self.state.next_ticket,
                since=now,
                resumes_epoch=turn.resumes_epoch or turn.epoch,
                phase=turn.phase,
            )
        )
        self.state.next_ticket += 1
        self._grant_ready(now)
