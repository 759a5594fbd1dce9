"""Asking for the turn, yielding it and granting it: the queue proper."""

from __future__ import annotations

from timeshare.history import HISTORY_TURNS
from timeshare.refusals import Refusal
from timeshare.scheduling import backfill, ordering, switch_costs
from timeshare.scheduling.base import (
    QueueBase,
    QueueError,
)
from timeshare.scheduling.state import StoredGrant, StoredTurn, Waiter


class Turns(QueueBase):
    def check_acquire(self, job: str, request_id: str, yielding: int = 0) -> None:
        """Refuse an acquire that cannot be served, without changing anything.
        ``yielding``: the epoch of the turn the same message gives back first."""
        if not request_id:
            raise QueueError(Refusal.INVALID_ARGUMENT, "request_id must not be empty")
        if request_id in self.state.aborted_requests:
            return  # answered with its reason by request()
        if self.state.served_requests.get(job) == request_id:
            raise QueueError(
                Refusal.FAILED_PRECONDITION,
                f"request {request_id!r} of job {job!r} was granted and yielded already",
            )
        turn = self.state.turn
        given_back = (turn.epoch, turn.resumes_epoch or -1) if turn is not None else ()
        if (
            turn is not None
            and turn.job == job
            and turn.request_id != request_id
            and (yielding not in given_back)
        ):
            raise QueueError(
                Refusal.FAILED_PRECONDITION,
                f"job {job!r} already holds the turn (epoch {turn.epoch}); yield it first",
            )
        for waiter in self.state.queue:
            if waiter.job == job and waiter.request_id != request_id:
                what = "its preempted turn resumes" if waiter.resumes_epoch else "its request"
                raise QueueError(
                    Refusal.FAILED_PRECONDITION,
                    f"job {job!r} already waits ({what}: {waiter.request_id!r})",
                )

    def request(
        self,
        job: str,
        request_id: str,
        now: float,
        call_id: str = "",
        trace_context: dict[str, str] | None = None,
        phase: str = "",
    ) -> StoredGrant | None:
        """Queue an acquire (once per request_id); return its grant if it is granted now.
        ``call_id`` names the caller now waiting (a retry of the request takes it over)."""
        self.check_acquire(job, request_id)
        self.raise_if_aborted(request_id)
        self.touch(job, now)
        self._clock = now
        if self.grant_for(job, request_id) is not None:
            self.state.turn_call_id = call_id
        elif self.is_waiting(job, request_id):
            for waiter in self.state.queue:
                if waiter.request_id == request_id:
                    waiter.call_id = call_id
        else:
            self._note_ask(self.state.jobs[job], now)
            self.state.queue.append(
                Waiter(
                    job=job,
                    request_id=request_id,
                    ticket=self.state.next_ticket,
                    since=now,
                    call_id=call_id,
                    trace_context=dict(trace_context or {}),
                    phase=phase,
                )
            )
            self.state.next_ticket += 1
            self._limit_banked_share(job)
            self._grant_ready(now)
        return self.grant_for(job, request_id)

    def _limit_banked_share(self, job: str) -> None:
        """A job that comes back after a while away (neither waiting nor
        holding) keeps at most fair_credit_seconds of the share it did not
        use, so it cannot take the GPU for as long as it was away."""
        policy = self.state.policy
        if not self.policies or policy.ordering != "fair":
            return
        turn = self.state.turn
        active = {w.job for w in self.state.queue} | ({turn.job} if turn is not None else set())
        others = [self.state.jobs[j].share_seconds for j in active - {job}]
        if others:
            entry = self.state.jobs[job]
            floor = min(others) - policy.fair_credit_seconds
            entry.share_seconds = max(entry.share_seconds, floor)

    def raise_if_aborted(self, request_id: str) -> None:
        reason = self.state.aborted_requests.get(request_id)
        if reason is not None:
            abort = self.state.switch_aborts.get(request_id)
            details = abort.model_dump() if abort is not None else None
            raise QueueError(Refusal.ABORTED, reason, details)

    def grant_for(self, job: str, request_id: str) -> StoredGrant | None:
        turn = self.state.turn
        if turn is not None and turn.job == job and turn.request_id == request_id:
            return turn
        return None

    def is_waiting(self, job: str, request_id: str) -> bool:
        return any(w.job == job and w.request_id == request_id for w in self.state.queue)

    def cancel(self, job: str, request_id: str, now: float, call_id: str = "") -> bool:
        """Withdraw a request whose caller went away: a waiting one (even one
        being switched in), or one granted just as its caller left, which
        nobody else would ever yield. A withdrawal by an older call than the
        one now waiting (a retry took over) changes nothing."""
        turn = self.grant_for(job, request_id)
        if turn is not None:
            if call_id and self.state.turn_call_id != call_id:
                return False
            self.release(job, turn.resumes_epoch or turn.epoch, now)
            return True
        for waiter in self.state.queue:
            if waiter.job == job and waiter.request_id == request_id:
                if call_id and waiter.call_id != call_id:
                    return False
                self.state.queue.remove(waiter)
                self._grant_ready(now)
                return True
        return False

    def check_release(self, job: str, epoch: int) -> None:
        if self.state.released.get(job) == epoch:
            return  # a retried yield: answered again, changes nothing
        entry = self.state.jobs.get(job)
        if entry is not None and entry.preempted and self._epoch_known_to(job) == epoch:
            return
        turn = self.state.turn
        if turn is None or turn.job != job:
            holder = turn.job if turn is not None else "nobody"
            raise QueueError(
                Refusal.FAILED_PRECONDITION,
                f"job {job!r} does not hold the turn of group {self.state.group!r} "
                f"(held by {holder})",
            )
        if epoch not in (turn.epoch, turn.resumes_epoch):
            raise QueueError(
                Refusal.FAILED_PRECONDITION,
                f"stale epoch {epoch}: job {job!r} holds epoch {self._epoch_known_to(job)}",
            )

    def keep_turn(self, job: str, epoch: int, phase: str, now: float) -> tuple[bool, float]:
        """The holder goes on into its next phase, ``phase``, without giving
        the turn back: it is on its GPUs already (Job.next_turn_nowait). As
        after a next_turn that kept the GPUs, the phase that ended is charged
        and recorded as a turn of its own, and the turn limit counts from now;
        the epoch stays. Returns whether a next_turn would have let others go
        first (someone waits, the group is paused, a node of the job is
        drained), in which case the holder is asked to yield at once and they
        go first after this phase; and the seconds the ended phase held."""
        self.check_release(job, epoch)
        turn = self.state.turn
        if turn is None or turn.job != job or self.state.released.get(job) == epoch:
            raise QueueError(
                Refusal.FAILED_PRECONDITION,
                f"job {job!r} no longer holds the turn of epoch {epoch} (it was given back "
                "or preempted); acquire a new one",
            )
        passed_on = not self._next_turn_keeps(job, epoch, now)
        self._clock = max(self._clock, now)
        self.touch(job, now)
        held = self._charge(job, turn, now)
        self._end_turn(turn, now, "")
        turn.granted_at, turn.phase = now, phase
        turn.waited_seconds = turn.switch_seconds = 0.0
        self.state.recent_turns.append(
            StoredTurn(job=job, epoch=epoch, requested_at=now, granted_at=now, phase=phase)
        )
        del self.state.recent_turns[:-HISTORY_TURNS]
        if passed_on and not turn.kept_past_others_at:
            turn.kept_past_others_at = now
        return passed_on, held

    def _next_turn_keeps(self, job: str, epoch: int, now: float) -> bool:
        """Whether a next_turn now would grant the job its next turn at once,
        nothing moved: tried on a copy of the state, so that nothing the
        workflow holds (a switch plan under way) is replaced."""
        probe = type(self)(self.state.model_copy(deep=True))
        probe._clock = self._clock
        probe.release(job, epoch, now, asks_again=True)
        grant = probe.request(job, f"keep-turn-probe-{epoch}", now)
        return grant is not None and grant.switch_seconds == 0.0

    def release(self, job: str, epoch: int, now: float, asks_again: bool = False) -> float:
        """Record a yield; nothing moves on the nodes. Returns seconds held.
        ``asks_again``: the same message asks for the next turn (next_turn)."""
        self.check_release(job, epoch)
        self.touch(job, now)
        entry = self.state.jobs.get(job)
        if self.state.released.get(job) == epoch:
            return 0.0
        self.state.released[job] = epoch
        turn = self.state.turn
        if turn is not None and turn.job == job:
            self.state.served_requests[job] = turn.request_id
        if entry is not None and entry.preempted:
            # The job finished while preempted: its waiting resumption goes.
            entry.preempted = False
            self.state.queue = [w for w in self.state.queue if w.job != job]
            self._grant_ready(now)
            return 0.0
        assert turn is not None
        held = self._charge(job, turn, now) if entry is not None else 0.0
        if entry is not None:
            entry.yielded_at, entry.yielded_phase = now, turn.phase
        self._end_turn(turn, now, "")
        self.state.turn = None
        self.state.since = now
        self._anticipate(job, turn, now)
        if not (asks_again and self._only_backfill_waits(turn)):
            # A regular job asking again goes before the backfill jobs that
            # wait: its request, next, grants.
            self._grant_ready(now)
        return held

    def _only_backfill_waits(self, turn: StoredGrant) -> bool:
        eligible = self._eligible()
        return bool(eligible) and not backfill.contenders(turn, self.state.jobs, eligible)

    def _epoch_known_to(self, job: str) -> int:
        """The epoch the job itself was told: a resumed turn keeps its first epoch."""
        turn = self.state.turn
        if turn is not None and turn.job == job:
            return turn.resumes_epoch or turn.epoch
        for waiter in self.state.queue:
            if waiter.job == job and waiter.resumes_epoch:
                return waiter.resumes_epoch
        return 0

    def _eligible(self) -> list[Waiter]:
        """The waiters that may go next: the group is not paused, none of
        their nodes is drained, and (Rules 4) their switches cost less than
        the gap they would fill; in arrival order."""
        if self.state.paused:
            return []
        drained = set(self.state.drained)
        eligible = [
            waiter
            for waiter in self.state.queue
            if not drained.intersection(self.state.jobs[waiter.job].nodes)
        ]
        return switch_costs.may_go(self.state, eligible, self._clock)

    def _next_waiter(self, now: float | None = None) -> Waiter | None:
        """The waiter that goes next: by the group's policy (ordering.py), or
        in groups from before policies, the first eligible one."""
        eligible = self._eligible()
        if not eligible:
            return None
        if not self.policies or len(eligible) == 1:
            return eligible[0]
        when = self._clock if now is None else now
        return ordering.in_grant_order(eligible, self.state.jobs, self.state.policy, when)[0]

    def _backfill_behind(self, planned: Waiter, first: Waiter | None) -> bool:
        jobs = self.state.jobs
        return first is not None and jobs[planned.job].backfill and not jobs[first.job].backfill

    def _charge(self, job: str, turn: StoredGrant, now: float) -> float:
        """Charge the job for the GPU time of its turn (switch time is no one's)."""
        held = max(0.0, now - turn.granted_at)
        entry = self.state.jobs[job]
        entry.held_seconds += held
        entry.share_seconds += held / entry.weight
        if entry.backfill:
            self.state.backfill_busy_seconds += held
            self.state.backfill_delay_seconds += backfill.delay_caused(
                turn.granted_at, now, self.state.queue, self.state.jobs
            )
        return held

    def _end_turn(self, turn: StoredGrant, now: float, ended_by: str) -> None:
        for record in reversed(self.state.recent_turns):
            if record.epoch == turn.epoch:
                record.released_at = now
                record.ended_by = ended_by
                return

    def _grant_ready(self, now: float, switched: tuple[int, float, bool] | None = None) -> None:
        """Grant the next waiter at once when it needs no node to move. After
        a switch, under policies, the waiter it was for goes first if it still
        may: a switch under way completes, even if someone who asked meanwhile
        would come first now (it is next in line, and may preempt)."""
        self._clock = max(self._clock, now)
        waiter = self._next_waiter(now)
        anticipated = self._anticipated(now)
        if anticipated is not None:
            # Held open for one job: nobody else is granted until it asks or
            # the hold ends (expire()).
            asks = [w for w in self._eligible() if w.job == anticipated]
            if not asks:
                return
            waiter = asks[0]
            self.state.anticipation = None
        if switched is not None and self.policies:
            planned = [w for w in self._eligible() if w.ticket == switched[0]]
            # A backfill job switched in is not granted past a regular job
            # that asked meanwhile.
            if planned and not self._backfill_behind(planned[0], waiter):
                waiter = planned[0]
        if not self.needs_switch() or waiter is None or self.moves_for(waiter.job):
            return
        self.state.queue.remove(waiter)
        self.state.turn_call_id = waiter.call_id
        self.state.epoch += 1
        self.state.grants += 1
        waited = max(0.0, now - waiter.since)
        entry = self.state.jobs[waiter.job]
        entry.turns += 1
        entry.waited_seconds += waited
        entry.preempted = False
        restored_ahead, entry.restored_ahead = entry.restored_ahead, False
        after_switch = switched is not None and switched[0] == waiter.ticket
        switch_seconds = switched[1] if switched and after_switch else 0.0
        self.state.since = now
        self.state.turn = StoredGrant(
            job=waiter.job,
            request_id=waiter.request_id,
            epoch=self.state.epoch,
            ticket=waiter.ticket,
            granted_at=now,
            waited_seconds=waited,
            switch_seconds=switch_seconds,
            resumes_epoch=waiter.resumes_epoch,
            context_restored=bool(switched and after_switch and switched[2]) or restored_ahead,
            phase=waiter.phase,
        )
        self.state.recent_turns.append(
            StoredTurn(
                job=waiter.job,
                epoch=self.state.epoch,
                requested_at=waiter.since,
                granted_at=now,
                switch_seconds=switch_seconds,
                phase=waiter.phase,
            )
        )
        del self.state.recent_turns[:-HISTORY_TURNS]

    def pause(self, paused: bool, now: float) -> None:
        if paused != self.state.paused:
            self.state.since = now
        self.state.paused = paused
        self._grant_ready(now)

    def drain(self, node: str, drained: bool, now: float) -> None:
        nodes = set(self.state.drained)
        nodes.add(node) if drained else nodes.discard(node)
        self.state.drained = sorted(nodes)
        self._grant_ready(now)
