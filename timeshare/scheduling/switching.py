"""Planning a switch (which nodes move what) and recording its end."""

from __future__ import annotations

from timeshare.history import HISTORY_SWITCHES
from timeshare.refusals import Refusal
from timeshare.scheduling import switch_costs
from timeshare.scheduling.base import (
    UNKNOWN_RESIDENT,
    QueueBase,
    QueueError,
    remember,
)
from timeshare.scheduling.state import (
    StoredGrant,
    StoredMove,
    StoredSwitch,
    SwitchAbort,
    SwitchPlan,
    Waiter,
)


class Switching(QueueBase):
    def needs_switch(self) -> bool:
        """True when a waiter may go next but nodes must move first."""
        s = self.state
        return (
            s.turn is None and s.switching is None and not s.anticipation and bool(self._eligible())
        )

    def begin_switch(self, now: float) -> SwitchPlan:
        """Plan the switch to the next waiter."""
        self._clock = max(self._clock, now)
        waiter = self._next_waiter(now)
        if not self.needs_switch() or waiter is None:
            raise QueueError(Refusal.FAILED_PRECONDITION, "no switch is due")
        return self._begin(waiter, now, prefetch=False)

    def _begin(self, waiter: Waiter, now: float, prefetch: bool) -> SwitchPlan:
        self.state.plans += 1
        moves = self.moves_for(waiter.job)
        moves += self._leaving_elsewhere(moves)
        plan = SwitchPlan(
            waiter=waiter,
            epoch=self.state.epoch + 1,
            moves=moves,
            started_at=now,
            number=self.state.plans,
            whole_jobs=True,
            prefetch=prefetch,
        )
        self.state.switching = plan
        self.state.since = now
        return plan

    def switch_target_waits(self) -> bool:
        plan = self.state.switching
        return plan is not None and self.switch_target_waits_for(plan)

    def abort_switch(self, reason: str, now: float, abort: SwitchAbort | None = None) -> None:
        """Give up on the switch: its waiter (if still there) is told ``reason``
        (and ``abort``, for its typed error). A preempted turn that cannot come
        back ends its job: it is evicted. A run of failures ends only where the
        waiter was told: a plan dropped because nobody waits any more leaves
        it to the next one."""
        plan = self._plan()
        self.state.switching = None
        self.state.degraded_cause = ""
        self.state.since = now
        if reason:
            self.state.failing = None
        if self.switch_target_waits_for(plan):
            if plan.waiter.resumes_epoch:
                self.evict(plan.waiter.job, f"its preempted turn could not resume: {reason}", now)
                return
            self.state.queue = [w for w in self.state.queue if w.ticket != plan.waiter.ticket]
            remember(self.state.aborted_requests, plan.waiter.request_id, reason)
            if abort is not None:
                remember(self.state.switch_aborts, plan.waiter.request_id, abort)
        self._grant_ready(now)

    def set_switch_aside(self, now: float) -> None:
        """Stop a switch that keeps failing without dropping its waiter: the next
        plan starts from what each node reported. The group stays degraded."""
        self._plan()
        self.state.switching = None
        self._grant_ready(now)

    def switch_plan_stands(self) -> bool:
        """The switch's waiter would still go next (the group is not paused, its
        nodes are not drained), and no node the plan only evicts from has been
        drained since (its agent may be down: the next plan leaves it alone)."""
        plan = self.state.switching
        waiter = self._next_waiter()
        drained = set(self.state.drained)
        return (
            plan is not None
            and waiter is not None
            and waiter.ticket == plan.waiter.ticket
            and not any(not move.admit and move.node in drained for move in plan.moves)
        )

    def switch_target_waits_for(self, plan: SwitchPlan) -> bool:
        return any(w.ticket == plan.waiter.ticket for w in self.state.queue)

    def finish_switch(self, now: float, restored: bool = False) -> StoredGrant | None:
        """Every node reported: record the new residency and grant the waiter.
        ``restored``: some node brought the job's state back from host memory."""
        plan = self._plan()
        for move in plan.moves:
            self._now_resident(move)
        prefetched = self.state.jobs.get(plan.waiter.job) if plan.prefetch else None
        if prefetched is not None and restored:
            prefetched.restored_ahead = True
        self.state.switching = None
        self.state.degraded_cause = ""
        self.state.failing = None
        self.state.switches += 1
        self.state.since = now
        seconds = max(0.0, now - plan.started_at)
        self.state.switch_seconds_total += seconds
        self._grant_ready(now, switched=(plan.waiter.ticket, seconds, restored))
        turn = self.state.turn
        return turn if turn is not None and turn.ticket == plan.waiter.ticket else None

    def moves_for(self, job: str) -> list[StoredMove]:
        moves = []
        for node in self.state.jobs[job].nodes:
            resident = self.state.resident.get(node, UNKNOWN_RESIDENT)
            if resident != job:
                evict = [] if resident == UNKNOWN_RESIDENT else [resident]
                moves.append(StoredMove(node=node, admit=job, evict=evict))
        return moves

    def _leaving_elsewhere(self, moves: list[StoredMove]) -> list[StoredMove]:
        """The jobs these moves evict leave their other nodes too, except
        drained ones: their agents may be down for maintenance."""
        left_alone = {move.node for move in moves} | set(self.state.drained)
        leaving = {job for move in moves for job in move.evict}
        return [
            StoredMove(node=node, admit="", evict=[job])
            for node, job in sorted(self.state.resident.items())
            if job in leaving and node not in left_alone
        ]

    def _now_resident(self, move: StoredMove) -> None:
        if move.admit:
            self.state.resident[move.node] = move.admit
        else:
            # Nothing of the group's runs there; the next switch there looks.
            self.state.resident.pop(move.node, None)

    def _plan(self) -> SwitchPlan:
        if self.state.switching is None:
            raise QueueError(Refusal.FAILED_PRECONDITION, "no switch is under way")
        return self.state.switching

    def record_switches(self, records: list[StoredSwitch]) -> None:
        self.state.recent_switches.extend(records)
        switch_costs.learn(self.state.jobs, records)
        del self.state.recent_switches[:-HISTORY_SWITCHES]

    def switches_are_quick(self, seconds: float) -> bool:
        """Whether the group's last switch went well within ``seconds`` on
        every node it moved (False before any switch)."""
        switches = self.state.recent_switches
        if not switches:
            return False
        last = switches[-1].epoch
        return all(
            s.ok and s.finished_at - s.started_at < seconds for s in switches if s.epoch == last
        )
