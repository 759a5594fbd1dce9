"""Asking for the turn, yielding it and granting it: the queue proper."""

from __future__ import annotations

from timeshare.history import HISTORY_TURNS
from timeshare.refusals import Refusal
from timeshare.scheduling import anticipation, backfill, base, moves, ordering, prefetch
from timeshare.scheduling.base import (
    Group,
    QueueError,
    decides_by_policies,
)
from timeshare.scheduling.draft import draft
from timeshare.scheduling.state import GroupState, StoredGrant, StoredTurn, Waiter


def check_acquire(state: GroupState, job: str, request_id: str, yielding: int = 0) -> None:
    """Refuse an acquire that cannot be served, without changing anything.
    ``yielding``: the epoch of the turn the same message gives back first."""
    if not request_id:
        raise QueueError(Refusal.INVALID_ARGUMENT, "request_id must not be empty")
    if request_id in state.aborted_requests:
        return  # answered with its reason by request()
    if state.served_requests.get(job) == request_id:
        raise QueueError(
            Refusal.FAILED_PRECONDITION,
            f"request {request_id!r} of job {job!r} was granted and yielded already",
        )
    turn = state.turn
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
    for waiter in state.queue:
        if waiter.job == job and waiter.request_id != request_id:
            what = "its preempted turn resumes" if waiter.resumes_epoch else "its request"
            raise QueueError(
                Refusal.FAILED_PRECONDITION,
                f"job {job!r} already waits ({what}: {waiter.request_id!r})",
            )


def request(
    group: Group,
    job: str,
    request_id: str,
    now: float,
    call_id: str = "",
    trace_context: dict[str, str] | None = None,
    phase: str = "",
) -> StoredGrant | None:
    """Queue an acquire (once per request_id); return its grant if it is granted now.
    ``call_id`` names the caller now waiting (a retry of the request takes it over)."""
    state = group.state
    check_acquire(state, job, request_id)
    raise_if_aborted(state, request_id)
    base.touch(state, job, now)
    group.clock = now
    if grant_for(state, job, request_id) is not None:
        state.turn_call_id = call_id
    elif is_waiting(state, job, request_id):
        for waiter in state.queue:
            if waiter.request_id == request_id:
                waiter.call_id = call_id
    else:
        prefetch.note_ask(state.jobs[job], now)
        enqueue(state, Waiter(job=job, request_id=request_id, ticket=0, since=now,
                              call_id=call_id, trace_context=dict(trace_context or {}),
                              phase=phase))  # fmt: skip
        _limit_banked_share(state, job)
        grant_ready(group, now)
    return grant_for(state, job, request_id)


def enqueue(state: GroupState, waiter: Waiter) -> None:
    """The waiter joins the queue with the next ticket (arrival order)."""
    waiter.ticket = state.next_ticket
    state.next_ticket += 1
    state.queue.append(waiter)


def _limit_banked_share(state: GroupState, job: str) -> None:
    """A job that comes back after a while away (neither waiting nor
    holding) keeps at most fair_credit_seconds of the share it did not
    use, so it cannot take the GPU for as long as it was away."""
    policy = state.policy
    if not decides_by_policies(state) or policy.ordering != "fair":
        return
    turn = state.turn
    active = {w.job for w in state.queue} | ({turn.job} if turn is not None else set())
    others = [state.jobs[j].share_seconds for j in active - {job}]
    if others:
        entry = state.jobs[job]
        floor = min(others) - policy.fair_credit_seconds
        entry.share_seconds = max(entry.share_seconds, floor)


def raise_if_aborted(state: GroupState, request_id: str) -> None:
    reason = state.aborted_requests.get(request_id)
    if reason is not None:
        abort = state.switch_aborts.get(request_id)
        details = abort.model_dump() if abort is not None else None
        raise QueueError(Refusal.ABORTED, reason, details)


def grant_for(state: GroupState, job: str, request_id: str) -> StoredGrant | None:
    turn = state.turn
    if turn is not None and turn.job == job and turn.request_id == request_id:
        return turn
    return None


def is_waiting(state: GroupState, job: str, request_id: str) -> bool:
    return any(w.job == job and w.request_id == request_id for w in state.queue)


def cancel(group: Group, job: str, request_id: str, now: float, call_id: str = "") -> bool:
    """Withdraw a request whose caller went away: a waiting one (even one
    being switched in), or one granted just as its caller left, which
    nobody else would ever yield. A withdrawal by an older call than the
    one now waiting (a retry took over) changes nothing."""
    state = group.state
    turn = grant_for(state, job, request_id)
    if turn is not None:
        if call_id and state.turn_call_id != call_id:
            return False
        yield_turn(group, job, turn.told_epoch, now)
        return True
    for waiter in state.queue:
        if waiter.job == job and waiter.request_id == request_id:
            if call_id and waiter.call_id != call_id:
                return False
            state.queue.remove(waiter)
            grant_ready(group, now)
            return True
    return False


def check_yield(state: GroupState, job: str, epoch: int) -> None:
    if state.yielded.get(job) == epoch:
        return  # a retried yield: answered again, changes nothing
    entry = state.jobs.get(job)
    if entry is not None and entry.preempted and epoch_known_to(state, job) == epoch:
        return
    turn = state.turn
    if turn is None or turn.job != job:
        holder = turn.job if turn is not None else "nobody"
        raise QueueError(
            Refusal.FAILED_PRECONDITION,
            f"job {job!r} does not hold the turn of group {state.group!r} (held by {holder})",
        )
    if epoch not in (turn.epoch, turn.resumes_epoch):
        raise QueueError(
            Refusal.FAILED_PRECONDITION,
            f"stale epoch {epoch}: job {job!r} holds epoch {epoch_known_to(state, job)}",
        )


def keep_turn(group: Group, job: str, epoch: int, phase: str, now: float) -> tuple[bool, float]:
    """The holder goes on into its next phase, ``phase``, without giving
    the turn back: it is on its GPUs already (Job.next_turn_nowait). As
    after a next_turn that kept the GPUs, the phase that ended is charged
    and recorded as a turn of its own, and the turn limit counts from now;
    the epoch stays. Returns whether a next_turn would have let others go
    first (someone waits, the group is paused, a node of the job is
    drained), in which case the holder is asked to yield at once and they
    go first after this phase; and the seconds the ended phase held."""
    state = group.state
    check_yield(state, job, epoch)
    turn = state.turn
    if turn is None or turn.job != job or state.yielded.get(job) == epoch:
        raise QueueError(
            Refusal.FAILED_PRECONDITION,
            f"job {job!r} no longer holds the turn of epoch {epoch} (it was given back "
            "or preempted); acquire a new one",
        )
    passed_on = not _next_turn_keeps(group, job, epoch, now)
    group.tell(now)
    base.touch(state, job, now)
    held = charge(state, job, turn, now)
    end_turn(state, turn, now, "")
    turn.granted_at, turn.phase = now, phase
    turn.waited_seconds = turn.switch_seconds = 0.0
    state.recent_turns.append(
        StoredTurn(job=job, epoch=epoch, requested_at=now, granted_at=now, phase=phase)
    )
    del state.recent_turns[:-HISTORY_TURNS]
    if passed_on and not turn.kept_past_others_at:
        turn.kept_past_others_at = now
    return passed_on, held


def _next_turn_keeps(group: Group, job: str, epoch: int, now: float) -> bool:
    """Whether a next_turn now would grant the job its next turn at once,
    nothing moved: the yield and the request tried on a draft of the state
    and the clock, so that the very rules that would grant decide it."""
    probe = Group(draft(group.state), group.clock)
    yield_turn(probe, job, epoch, now, asks_again=True)
    grant = request(probe, job, f"keep-turn-probe-{epoch}", now)
    return grant is not None and grant.switch_seconds == 0.0


def yield_turn(group: Group, job: str, epoch: int, now: float, asks_again: bool = False) -> float:
    """Record a yield; nothing moves on the nodes. Returns seconds held.
    ``asks_again``: the same message asks for the next turn (next_turn)."""
    state = group.state
    check_yield(state, job, epoch)
    base.touch(state, job, now)
    entry = state.jobs.get(job)
    if state.yielded.get(job) == epoch:
        return 0.0
    state.yielded[job] = epoch
    turn = state.turn
    if turn is not None and turn.job == job:
        state.served_requests[job] = turn.request_id
    if entry is not None and entry.preempted:
        # The job finished while preempted: its waiting resumption goes.
        entry.preempted = False
        state.queue = [w for w in state.queue if w.job != job]
        grant_ready(group, now)
        return 0.0
    assert turn is not None
    held = charge(state, job, turn, now) if entry is not None else 0.0
    if entry is not None:
        entry.yielded_at, entry.yielded_phase = now, turn.phase
    end_turn(state, turn, now, "")
    state.turn = None
    state.since = now
    anticipation.anticipate(state, job, turn, now)
    if not (asks_again and _only_backfill_waits(state, turn, now)):
        # A regular job asking again goes before the backfill jobs that
        # wait: its request, next, grants.
        grant_ready(group, now)
    return held


def _only_backfill_waits(state: GroupState, turn: StoredGrant, now: float) -> bool:
    eligible = ordering.eligible(state, now)
    return bool(eligible) and not backfill.contenders(turn, state.jobs, eligible)


def epoch_known_to(state: GroupState, job: str) -> int:
    """The epoch the job itself was told: a resumed turn keeps its first epoch."""
    turn = state.turn
    if turn is not None and turn.job == job:
        return turn.told_epoch
    for waiter in state.queue:
        if waiter.job == job and waiter.resumes_epoch:
            return waiter.resumes_epoch
    return 0


def _backfill_behind(state: GroupState, planned: Waiter, first: Waiter | None) -> bool:
    jobs = state.jobs
    return first is not None and jobs[planned.job].backfill and not jobs[first.job].backfill


def charge(state: GroupState, job: str, turn: StoredGrant, now: float) -> float:
    """Charge the job for the GPU time of its turn (switch time is no one's)."""
    held = max(0.0, now - turn.granted_at)
    entry = state.jobs[job]
    entry.held_seconds += held
    entry.share_seconds += held / entry.weight
    if entry.backfill:
        state.backfill_busy_seconds += held
        state.backfill_delay_seconds += backfill.delay_caused(
            turn.granted_at, now, state.queue, state.jobs
        )
    return held


def end_turn(state: GroupState, turn: StoredGrant, now: float, ended_by: str) -> None:
    for record in reversed(state.recent_turns):
        if record.epoch == turn.epoch:
            record.released_at = now
            record.ended_by = ended_by
            return


def grant_ready(group: Group, now: float, switched: tuple[int, float, bool] | None = None) -> None:
    """Grant the next waiter at once when it needs no node to move. After
    a switch, under policies, the waiter it was for goes first if it still
    may: a switch under way completes, even if someone who asked meanwhile
    would come first now (it is next in line, and may preempt)."""
    state = group.state
    group.tell(now)
    waiter = ordering.next_waiter(state, now)
    anticipated = anticipation.anticipated(state, now)
    if anticipated is not None:
        # Held open for one job: nobody else is granted until it asks or
        # the hold ends (expire()).
        asks = [w for w in ordering.eligible(state, now) if w.job == anticipated]
        if not asks:
            return
        waiter = asks[0]
        state.anticipation = None
    if switched is not None and decides_by_policies(state):
        planned = [w for w in ordering.eligible(state, now) if w.ticket == switched[0]]
        # A backfill job switched in is not granted past a regular job
        # that asked meanwhile.
        if planned and not _backfill_behind(state, planned[0], waiter):
            waiter = planned[0]
    if not moves.needs_switch(state, now) or waiter is None or moves.moves_for(state, waiter.job):
        return
    state.queue.remove(waiter)
    state.turn_call_id = waiter.call_id
    state.epoch += 1
    state.grants += 1
    waited = max(0.0, now - waiter.since)
    entry = state.jobs[waiter.job]
    entry.turns += 1
    entry.waited_seconds += waited
    entry.preempted = False
    restored_ahead, entry.restored_ahead = entry.restored_ahead, False
    after_switch = switched is not None and switched[0] == waiter.ticket
    switch_seconds = switched[1] if switched and after_switch else 0.0
    state.since = now
    state.turn = granted = StoredGrant(
        job=waiter.job,
        request_id=waiter.request_id,
        epoch=state.epoch,
        ticket=waiter.ticket,
        granted_at=now,
        waited_seconds=waited,
        switch_seconds=switch_seconds,
        resumes_epoch=waiter.resumes_epoch,
        context_restored=bool(switched and after_switch and switched[2]) or restored_ahead,
        phase=waiter.phase,
    )
    remember_turn(state, granted, requested_at=waiter.since)


def remember_turn(state: GroupState, grant: StoredGrant, requested_at: float) -> None:
    """A turn begins in the group's bounded record of recent turns."""
    state.recent_turns.append(
        StoredTurn(
            job=grant.job,
            epoch=grant.epoch,
            requested_at=requested_at,
            granted_at=grant.granted_at,
            switch_seconds=grant.switch_seconds,
            phase=grant.phase,
        )
    )
    del state.recent_turns[:-HISTORY_TURNS]


def pause(group: Group, paused: bool, now: float) -> None:
    state = group.state
    if paused != state.paused:
        state.since = now
    state.paused = paused
    grant_ready(group, now)


def drain(group: Group, node: str, drained: bool, now: float) -> None:
    state = group.state
    nodes = set(state.drained)
    nodes.add(node) if drained else nodes.discard(node)
    state.drained = sorted(nodes)
    grant_ready(group, now)
