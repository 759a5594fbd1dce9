"""Fair share between busy jobs: holding the turn open for a yielder behind its share."""

from __future__ import annotations

from timeshare.scheduling import ordering, switch_costs
from timeshare.scheduling.base import (
    QueueBase,
)
from timeshare.scheduling.state import Anticipation, StoredGrant, Waiter

# A turn held open for a yielder behind its share lasts this many times its
# usual gap before asking again, plus this slack (capped by the policy).
ANTICIPATION_GAP_SHARE = 2.0
ANTICIPATION_SLACK_SECONDS = 0.005


class Anticipating(QueueBase):
    def _anticipate(self, job: str, turn: StoredGrant, now: float) -> None:
        """Hold the turn open for a yielder that fair share would serve before
        the jobs waiting, if it usually asks again within the policy's
        fair_anticipation_seconds (as disk schedulers anticipate a process's
        next read). Without it, two busy jobs alternate whatever their shares:
        the waiter is granted as the holder yields, before it can ask again.
        The yielder is still on its GPUs: its next turn moves nothing."""
        s, policy = self.state, self.state.policy
        cap = policy.fair_anticipation_seconds
        if not self.rules.anticipation or policy.ordering != "fair" or cap <= 0 or s.paused:
            return
        entry = s.jobs[job]
        gap = entry.ask_gaps.get(turn.phase)
        waiting = [w for w in self._eligible() if w.job != job]
        if gap is None or gap > cap or not waiting or self.moves_for(job):
            return
        # Behind even after another turn like this one: a job just level
        # with the others is not kept, so equal jobs still alternate.
        held = max(0.0, now - turn.granted_at) / entry.weight
        first = ordering.in_grant_order(waiting, s.jobs, policy, now)[0]
        if entry.share_seconds + held > s.jobs[first.job].share_seconds:
            return
        asks = Waiter(job=job, request_id="", ticket=s.next_ticket, since=now, phase=turn.phase)
        if ordering.in_grant_order([asks, first], s.jobs, policy, now)[0] is not asks:
            return  # outranked (priority, phase priority, aging)
        window = min(cap, ANTICIPATION_GAP_SHARE * gap + ANTICIPATION_SLACK_SECONDS)
        # Held open no longer than switching to the first waiter would take.
        switch = switch_costs.anticipation_cap(s, first.job)
        if switch is not None:
            window = min(window, switch)
        if window <= 0:
            return
        s.anticipation = Anticipation(job=job, until=now + window)

    def _anticipated(self, now: float) -> str | None:
        """The job the turn is held open for now, if any (an expired or void
        hold is dropped)."""
        held = self.state.anticipation
        if held is None:
            return None
        if now >= held.until or held.job not in self.state.jobs or self.state.paused:
            self.state.anticipation = None
            return None
        return held.job
