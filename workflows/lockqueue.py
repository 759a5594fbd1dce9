"""The lock queue of one group: plain data in, decisions out.

This module imports nothing from Temporal and does no I/O; time is always
passed in. GroupWorkflow feeds it every message and timer and carries out the
switches it plans, so every scheduling rule lives here and is tested here.

Rules:
- at most one job holds the turn; the turn is named by a growing epoch;
- grants follow arrival order (tickets), with two documented exceptions: a
  waiter that needs a drained node is passed over (it keeps its place), and a
  paused group grants nothing;
- a job is granted only after every other job's state has left every node it
  needs: the planned switch evicts the resident job and admits the next one,
  and the grant happens only when every node has reported;
- a job leaves as a whole: when the next job needs one of its nodes, it
  leaves every node it is resident on (drained nodes excepted), and where it
  leaves more than one, it is stopped on all of them before its state is
  checkpointed on any (the ranks of one job talk to each other; none may run
  on while another's state is gone);
- when the next job is already resident everywhere it runs, the grant is
  immediate and no node is touched (the lazy, "deferred snapshot" path);
- while nobody holds or waits, the job expected to ask first may be brought
  onto its nodes ahead of its request (prefetch), so that its request is
  granted at once; nobody is granted when that switch ends;
- every joined job holds a lease renewed by its messages; a job whose lease
  runs out is evicted, its turn (if any) passes on, and its next call is told
  why;
- with a turn limit, a holder that others wait for is asked to yield, and
  after a grace period is preempted: its state is checkpointed (the job does
  not notice) and it waits at the back of the queue to resume its turn.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any, TypeVar

from timeshare.history import HISTORY_SWITCHES, HISTORY_TURNS, GroupHistory
from timeshare.models import GroupStateName, GroupStatus, HeartbeatOutput, JobStatus
from timeshare.refusals import Refusal
from timeshare.workflows import ordering
from timeshare.workflows.group_state import (
    RULES_ANTICIPATION,
    RULES_POLICIES,
    Anticipation,
    GroupState,
    JobEntry,
    StoredGrant,
    StoredMove,
    StoredSwitch,
    StoredTurn,
    SwitchAbort,
    SwitchFailing,
    SwitchPlan,
    Waiter,
)

MAX_JOBS_PER_GROUP = 64
MAX_NODES_PER_JOB = 256
# Reasons kept for requests and jobs that were ended by the scheduler, so the
# caller's next message can be told why; the oldest are forgotten first.
MAX_REMEMBERED_REASONS = 256
# The kinds of lease a job may run out of (see LockQueue._lease_deadlines).
LEGACY, IDLE, HELD = "legacy", "idle", "held"
# Marks a node whose state a failed switch left uncertain: any job needs a
# switch there before it may be granted.
UNKNOWN_RESIDENT = "?"
# The longest pause between two attempts of a failing switch.
SWITCH_RETRY_PAUSE_MAX_SECONDS = 30.0
# A failure this long after the last one starts a new run of failures: the
# longest pause between attempts, and then some.
SWITCH_RUN_GAP_SECONDS = 2 * SWITCH_RETRY_PAUSE_MAX_SECONDS
# A turn held open for a yielder behind its share lasts this many times its
# usual gap before asking again, plus this slack (capped by the policy).
ANTICIPATION_GAP_SHARE = 2.0
ANTICIPATION_SLACK_SECONDS = 0.005
# Phases whose ask gaps a job keeps (the oldest is forgotten first).
MAX_PHASES_REMEMBERED = 16
# A request later than expected by more than this share of its usual gap,
# plus this many seconds, is no longer expected: a job that stopped asking
# is not brought in again and again ahead of the job that does ask.
PREFETCH_LATE_SHARE = 0.25
PREFETCH_LATE_SECONDS = 0.05


@dataclass(frozen=True)
class GroupSummary:
    """What a group shows outside its workflow (workflows/visibility.py)."""

    group: str
    state: GroupStateName
    holder: str
    holder_phase: str
    # The epoch whose holder is asked to yield (0: none; always 0 in groups
    # from before policies).
    yield_epoch: int
    epoch: int
    switches: int
    degraded_cause: str
    queue: tuple[str, ...]
    ordering: str
    phase_priority: tuple[tuple[str, int], ...]
    resident: tuple[tuple[str, str], ...]
    # Attempts of the switch failing now, and their last cause (0: none fails).
    failing_attempts: int = 0
    failing_cause: str = ""


class QueueError(Exception):
    """A message the queue refuses; ``code`` says why, as the gRPC status to
    report; ``details``, what the client's typed error carries (SwitchFailed)."""

    def __init__(self, code: Refusal, message: str, details: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


@dataclass(frozen=True)
class FailedMove:
    """What a node said when its part of a switch failed: ``stuck``, the job
    whose state it could not move off (a checkpoint or a lock failed)."""

    node: str
    cause: str
    stuck: str = ""
    # The admitted job's state could not come back there.
    restore_failed: bool = False


@dataclass(frozen=True)
class RetryVerdict:
    """What follows a failed switch attempt (LockQueue.switch_failed):
    try again after ``pause`` seconds; or at once, the jobs in ``evicted``
    having been evicted because their state could not be moved; or nothing,
    ``given_up``: the waiter was told why (or nobody waits any more)."""

    pause: float = 0.0
    evicted: tuple[str, ...] = ()
    given_up: bool = False


@dataclass(frozen=True)
class Snapshot:
    """The state before a message, so that a handler that fails part-way can
    be undone. The bounded histories are only appended to (and the last turn
    closed), so a shallow copy and the last turn's fields are enough of them."""

    core: dict[str, Any]
    turns: list[StoredTurn]
    last_turn: dict[str, Any] | None
    switches: list[StoredSwitch]


def _same_objects(these: list[Any], those: list[Any]) -> bool:
    return len(these) == len(those) and all(a is b for a, b in zip(these, those, strict=True))


Remembered = TypeVar("Remembered")


def _remember(reasons: dict[str, Remembered], key: str, reason: Remembered) -> None:
    reasons[key] = reason
    while len(reasons) > MAX_REMEMBERED_REASONS:
        del reasons[next(iter(reasons))]


class LockQueue:
    """Decisions over a GroupState. Every method either changes the state
    consistently or raises QueueError and changes nothing."""

    def __init__(self, state: GroupState, lease_from_grant: bool = True) -> None:
        """``lease_from_grant``: a contended holder's lease starts no earlier
        than its grant (False only where a workflow replays a run from before
        that rule)."""
        self.state = state
        self._lease_from_grant = lease_from_grant
        # The latest time the queue was told of: what a call without one
        # (a status query) orders the waiters by.
        self._clock = state.since

    @property
    def policies(self) -> bool:
        """Whether the group decides by scheduling policies (rules 2) or as
        groups created before them did (FIFO, one lease for all)."""
        return self.state.rules >= RULES_POLICIES

    # -- membership -------------------------------------------------------

    def check_join(self, job: str, nodes: list[str]) -> None:
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
    ) -> bool:
        """Add or refresh a job; returns True when the job is new. A newcomer's
        share starts level with the least-served member's, so that it cannot
        take the GPU for as long as the others have had it."""
        self.check_join(job, nodes)
        self._clock = now
        self.state.evicted_jobs.pop(job, None)
        # Back before its agents let its processes go: they need not.
        self.state.releasing.pop(job, None)
        entry = self.state.jobs.get(job)
        if entry is None:
            self.state.jobs[job] = JobEntry(
                nodes=list(nodes),
                token_hash=token_hash,
                joined_at=now,
                last_seen=now,
                weight=weight,
                priority=priority,
                share_seconds=ordering.level_share(
                    e.share_seconds for e in self.state.jobs.values()
                ),
            )
            return True
        entry.nodes = list(nodes)
        entry.token_hash = token_hash
        entry.last_seen = now
        entry.weight, entry.priority = weight, priority
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

    def release_done(self, job: str, node: str) -> None:
        """The node's agent released the job's processes (or could not be reached)."""
        nodes = [n for n in self.state.releasing.get(job, []) if n != node]
        if nodes:
            self.state.releasing[job] = nodes
        else:
            self.state.releasing.pop(job, None)

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

    # -- acquire ------------------------------------------------------------

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

    # -- yield --------------------------------------------------------------

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
        probe = LockQueue(self.state.model_copy(deep=True), self._lease_from_grant)
        probe._clock = self._clock
        probe.release(job, epoch, now)
        grant = probe.request(job, f"keep-turn-probe-{epoch}", now)
        return grant is not None and grant.switch_seconds == 0.0

    def release(self, job: str, epoch: int, now: float) -> float:
        """Record a yield; nothing moves on the nodes. Returns seconds held."""
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
        self._grant_ready(now)
        return held

    def _anticipate(self, job: str, turn: StoredGrant, now: float) -> None:
        """Hold the turn open for a yielder that fair share would serve before
        the jobs waiting, if it usually asks again within the policy's
        fair_anticipation_seconds (as disk schedulers anticipate a process's
        next read). Without it, two busy jobs alternate whatever their shares:
        the waiter is granted as the holder yields, before it can ask again.
        The yielder is still on its GPUs: its next turn moves nothing."""
        s, policy = self.state, self.state.policy
        cap = policy.fair_anticipation_seconds
        if s.rules < RULES_ANTICIPATION or policy.ordering != "fair" or cap <= 0 or s.paused:
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

    # -- timers ---------------------------------------------------------------

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
                if self._lease_from_grant:
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
        outranks it (preempt_lower_after_seconds)."""
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
        return min(asked, default=None), min(preempt, default=None)

    def _outranked_from(self, turn: StoredGrant) -> float | None:
        policy, jobs = self.state.policy, self.state.jobs
        holder = ordering.holder_priority(jobs[turn.job], turn, policy)
        times = [
            ordering.outranks_holder_from(waiter, jobs[waiter.job], holder, policy)
            for waiter in self._eligible()
            if waiter.job != turn.job
        ]
        return min((t for t in times if t is not None), default=None)

    # -- operator controls ------------------------------------------------------

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

    # -- switches -----------------------------------------------------------

    def needs_switch(self) -> bool:
        """True when a waiter may go next but nodes must move first."""
        s = self.state
        return (
            s.turn is None and s.switching is None and not s.anticipation and bool(self._eligible())
        )

    def begin_switch(self, now: float, whole_jobs: bool = True) -> SwitchPlan:
        """Plan the switch to the next waiter. ``whole_jobs`` False: plan as
        schedulers did before jobs left as a whole (for their histories)."""
        self._clock = max(self._clock, now)
        waiter = self._next_waiter(now)
        if not self.needs_switch() or waiter is None:
            raise QueueError(Refusal.FAILED_PRECONDITION, "no switch is due")
        return self._begin(waiter, now, whole_jobs, prefetch=False)

    def _begin(self, waiter: Waiter, now: float, whole_jobs: bool, prefetch: bool) -> SwitchPlan:
        self.state.plans += 1
        moves = self.moves_for(waiter.job)
        if whole_jobs:
            moves += self._leaving_elsewhere(moves)
        plan = SwitchPlan(
            waiter=waiter,
            epoch=self.state.epoch + 1,
            moves=moves,
            started_at=now,
            number=self.state.plans,
            whole_jobs=whole_jobs,
            prefetch=prefetch,
        )
        self.state.switching = plan
        self.state.since = now
        return plan

    # -- prefetch -------------------------------------------------------------

    def _idle(self) -> bool:
        """Nobody holds, waits or is being switched in, and the group may grant."""
        s = self.state
        return s.turn is None and s.switching is None and not s.queue and not s.paused

    def expected_ask(self, job: str, now: float) -> float | None:
        """When the job is expected to ask again: as long after its last yield
        as it took after its recent turns of the same phase (RL jobs repeat
        their phases); None when unknown, or long overdue."""
        entry = self.state.jobs[job]
        gap = entry.ask_gaps.get(entry.yielded_phase)
        if not entry.yielded_at or gap is None:
            return None
        expected = entry.yielded_at + gap
        late = PREFETCH_LATE_SHARE * gap + PREFETCH_LATE_SECONDS
        return expected if now <= expected + late else None

    def prefetch_target(
        self, now: float, departed_ask_never: bool = True, guess_unknown: bool = True
    ) -> str | None:
        """The job worth bringing onto its nodes now, ahead of its request:
        while the group is idle, the job expected to ask first, if it is not
        resident already and every job it would evict is expected later. A
        job that left or was evicted never asks again; ``departed_ask_never``
        False: it blocks the prefetch, as it did before the change that let
        the memory of a job that left go to the next one at once.

        Where no job's next request can be told yet (each job's first
        iteration), the guess is the job away the longest (see
        ``_longest_away``); ``guess_unknown`` False: nothing is prefetched
        then, as before the change that made the guess."""
        s = self.state
        if not self.policies or s.policy.prefetch != "auto" or not self._idle():
            return None
        if s.failing is not None:
            return None  # switches fail here: move nothing on a guess
        expected = {job: self.expected_ask(job, now) for job in s.jobs}
        known = {job: at for job, at in expected.items() if at is not None}
        if not known:
            return self._longest_away() if guess_unknown else None
        target = min(known, key=lambda job: (known[job], job))
        moves = self.moves_for(target)
        if not moves or set(s.drained).intersection(s.jobs[target].nodes):
            return None
        evicted = {job for move in moves + self._leaving_elsewhere(moves) for job in move.evict}
        if departed_ask_never:
            evicted &= set(s.jobs)
        if any(known.get(job, known[target]) <= known[target] for job in evicted):
            return None
        return target

    def _longest_away(self) -> str | None:
        """With nobody's next request known: the job that has been away from
        its nodes the longest since its last turn, if everything it would
        evict yielded later than it did. Jobs that take turns in a cycle (two
        RL jobs alternating) come back in the order they left; a job that
        yielded just now is the likeliest to be busy elsewhere for a while. A
        job that has never held a turn, or that holds the memory already, is
        not a candidate."""
        s = self.state
        away = sorted(
            (entry.yielded_at, job)
            for job, entry in s.jobs.items()
            if entry.yielded_at and not set(s.drained).intersection(entry.nodes)
        )
        for yielded_at, job in away:
            moves = self.moves_for(job)
            if not moves:
                continue
            evicted = {j for move in moves + self._leaving_elsewhere(moves) for j in move.evict}
            if all(s.jobs[j].yielded_at > yielded_at for j in evicted & set(s.jobs)):
                return job
            return None  # the job away the longest would evict one away longer still
        return None

    def begin_prefetch(self, job: str, now: float, whole_jobs: bool = True) -> SwitchPlan:
        """Plan the switch that brings ``job`` onto its nodes before it asks."""
        self._clock = max(self._clock, now)
        if not self._idle() or job not in self.state.jobs or not self.moves_for(job):
            raise QueueError(Refusal.FAILED_PRECONDITION, f"no prefetch of job {job!r} is due")
        return self._begin(Waiter(job=job, request_id="", ticket=0, since=now), now, whole_jobs,
                           prefetch=True)  # fmt: skip

    def _note_ask(self, entry: JobEntry, now: float) -> None:
        if not entry.yielded_at:
            return
        gap = max(0.0, now - entry.yielded_at)
        before = entry.ask_gaps.pop(entry.yielded_phase, None)
        entry.ask_gaps[entry.yielded_phase] = gap if before is None else (before + gap) / 2
        while len(entry.ask_gaps) > MAX_PHASES_REMEMBERED:
            del entry.ask_gaps[next(iter(entry.ask_gaps))]
        entry.yielded_at = 0.0

    def switch_target_waits(self) -> bool:
        plan = self.state.switching
        return plan is not None and self.switch_target_waits_for(plan)

    def switch_failed(
        self,
        failures: list[FailedMove],
        done: list[str],
        failed: list[str],
        now: float,
    ) -> RetryVerdict:
        """Record an attempt that some nodes could not complete (the nodes
        that finished hold the admitted job now; the others are uncertain)
        and decide what follows. Attempts fail in a run that lasts until one
        succeeds; the run is given up after the policy's
        switch_give_up_seconds. Then the jobs whose state could not be moved
        are evicted and the switch tried once more, at once: the waiter gets
        the GPUs if it fits beside what is left there. If that fails too, or
        no node named a job to blame, the waiter is told why (SwitchAbort)."""
        plan = self._plan()
        plan.attempts += 1
        for move in plan.moves:
            if move.node in done:
                self._now_resident(move)
            elif move.node in failed:
                self.state.resident[move.node] = UNKNOWN_RESIDENT
        cause = "; ".join(f"node {f.node}: {f.cause}" for f in failures)
        if failures and all(f.restore_failed for f in failures):
            # Every other job's state is off these nodes, but this job's
            # state could not come back: it cannot have its turn.
            self.abort_switch(
                f"its state could not be restored: {cause}",
                now,
                SwitchAbort(job=plan.waiter.job, cause=cause),
            )
            return RetryVerdict(given_up=True)
        run = self.state.failing
        give_up = self.state.policy.switch_give_up_seconds
        if run is None or now - run.last_at > SWITCH_RUN_GAP_SECONDS:
            run = self.state.failing = SwitchFailing(since=now)
        run.attempts += 1
        run.last_at = now
        run.cause = cause
        for failure in failures:
            if failure.stuck and failure.stuck != plan.waiter.job:
                run.stuck[failure.stuck] = f"node {failure.node}: {failure.cause}"
        self.state.degraded_cause = f"switch failing: {cause} (attempt {run.attempts})"
        if plan.prefetch:
            # Nobody waits: nothing to give up on, and nobody to evict for.
            return RetryVerdict(pause=min(SWITCH_RETRY_PAUSE_MAX_SECONDS, 2.0**plan.attempts))
        given_up_at = run.since + give_up
        if now < given_up_at:
            pause = min(SWITCH_RETRY_PAUSE_MAX_SECONDS, 2.0**plan.attempts, given_up_at - now)
            return RetryVerdict(pause=max(0.0, pause))
        stuck = sorted(job for job in run.stuck if job in self.state.jobs)
        if stuck and not run.stuck_evicted:
            run.stuck_evicted = True
            for job in stuck:
                self.evict_failed(
                    job,
                    f"its state could not be moved off the GPU for {give_up:g} s "
                    f"({run.stuck[job]}); its processes run again",
                    now,
                )
            return RetryVerdict(evicted=tuple(stuck))
        # Where no node named a job (its agent did not answer, say): the jobs
        # those nodes were to move off, else the waiter's own.
        suspects = {job for m in plan.moves if m.node in failed for job in m.evict}
        blamed = sorted(run.stuck) or sorted(suspects) or [plan.waiter.job]
        abort = SwitchAbort(job=", ".join(blamed), cause=cause)
        self.abort_switch(
            f"the switch to job {plan.waiter.job!r} failed for {now - run.since:.0f} s "
            f"(attempt {run.attempts}), the state of job {abort.job} could not be moved: "
            f"{cause}; see `timeshare status {self.state.group}`, mend the cause and acquire again",
            now,
            abort,
        )
        return RetryVerdict(given_up=True)

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
            _remember(self.state.aborted_requests, plan.waiter.request_id, reason)
            if abort is not None:
                _remember(self.state.switch_aborts, plan.waiter.request_id, abort)
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

    # -- undoing a failed message ------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Cheap enough to take before every message (well under a millisecond)."""
        state = self.state
        return Snapshot(
            core=state.model_dump(exclude={"recent_turns", "recent_switches"}),
            turns=list(state.recent_turns),
            last_turn=state.recent_turns[-1].model_dump() if state.recent_turns else None,
            switches=list(state.recent_switches),
        )

    def changed_since(self, snapshot: Snapshot) -> bool:
        state = self.state
        turns, switches = state.recent_turns, state.recent_switches
        return (
            state.model_dump(exclude={"recent_turns", "recent_switches"}) != snapshot.core
            or not _same_objects(turns[:-1], snapshot.turns[:-1])
            or len(turns) != len(snapshot.turns)
            or (turns[-1].model_dump() if turns else None) != snapshot.last_turn
            or not _same_objects(switches, snapshot.switches)
        )

    def restore(self, snapshot: Snapshot) -> None:
        """Put the state back as it was when ``snapshot`` was taken."""
        turns = list(snapshot.turns)
        if turns and snapshot.last_turn is not None:
            turns[-1] = StoredTurn.model_validate(snapshot.last_turn)
        self.state = GroupState.model_validate(
            {**snapshot.core, "recent_turns": turns, "recent_switches": list(snapshot.switches)}
        )

    # -- status ---------------------------------------------------------------

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

    def record_switches(self, records: list[StoredSwitch]) -> None:
        self.state.recent_switches.extend(records)
        del self.state.recent_switches[:-HISTORY_SWITCHES]

    def history(self, now: float) -> GroupHistory:
        return GroupHistory(
            group=self.state.group,
            captured_at=now,
            turns=[t.as_record() for t in self.state.recent_turns],
            switches=[s.as_record() for s in self.state.recent_switches],
        )

    def summary(self, now: float) -> GroupSummary:
        """What the group shows outside its workflow (the status's fields
        that search attributes and the UI's details show), cheaper to make
        than the whole status and to compare with the last one shown."""
        s = self.state
        # A turn held open for its last holder shows as still held by it:
        # nothing changes outside for a hold its job ends by asking again.
        holder = s.anticipation.job if s.anticipation is not None else ""
        return GroupSummary(
            group=s.group,
            state=self._state_name(),
            holder=s.turn.job if s.turn is not None else holder,
            holder_phase=s.turn.phase if s.turn is not None else "",
            yield_epoch=self.yield_requested_epoch(now) if self.policies else 0,
            epoch=s.epoch,
            switches=s.switches,
            degraded_cause=s.degraded_cause,
            queue=tuple(self._queue_in_grant_order(now)),
            ordering=s.policy.ordering,
            phase_priority=tuple(sorted(s.policy.phase_priority.items())),
            resident=tuple(sorted(s.resident.items())),
            failing_attempts=s.failing.attempts if s.failing and s.degraded_cause else 0,
            failing_cause=s.failing.cause if s.failing and s.degraded_cause else "",
        )

    def _queue_in_grant_order(self, now: float) -> list[str]:
        s = self.state
        if not self.policies:
            return [w.job for w in s.queue]
        return [w.job for w in ordering.in_grant_order(s.queue, s.jobs, s.policy, now)]

    def _state_name(self) -> GroupStateName:
        s = self.state
        if s.degraded_cause:
            return "degraded"
        if s.switching is not None or self.needs_switch():
            return "switching"
        if s.turn is not None or s.anticipation is not None:
            return "held"
        return "paused" if s.paused else "idle"

    def status(self, now: float | None = None) -> GroupStatus:
        s = self.state
        when = self._clock if now is None else now
        return GroupStatus(
            group=s.group,
            state=self._state_name(),
            holder=s.turn.job if s.turn is not None else "",
            epoch=s.epoch,
            queue=self._queue_in_grant_order(when),
            jobs=[
                JobStatus(
                    job=name,
                    nodes=entry.nodes,
                    turns=entry.turns,
                    waited_seconds=entry.waited_seconds,
                    held_seconds=entry.held_seconds,
                    preempted=entry.preempted,
                    last_seen=entry.last_seen,
                    weight=entry.weight,
                    priority=entry.priority,
                    share_seconds=entry.share_seconds,
                )
                for name, entry in sorted(s.jobs.items())
            ],
            resident=dict(sorted(s.resident.items())),
            switches=s.switches,
            grants=s.grants,
            switch_seconds_total=s.switch_seconds_total,
            degraded_cause=s.degraded_cause,
            paused=s.paused,
            drained=list(s.drained),
            policy=s.policy.as_policy(),
            preemptions=s.preemptions,
            evictions=s.evictions,
            runs=s.runs,
            state_since=s.since,
            switching_to=s.switching.waiter.job if s.switching is not None else "",
            holder_phase=s.turn.phase if s.turn is not None else "",
            yield_requested=self.policies and self.yield_requested_epoch(when) != 0,
        )

    # -- internals ------------------------------------------------------------

    def _plan(self) -> SwitchPlan:
        if self.state.switching is None:
            raise QueueError(Refusal.FAILED_PRECONDITION, "no switch is under way")
        return self.state.switching

    def _is_active(self, job: str) -> bool:
        turn = self.state.turn
        return (turn is not None and turn.job == job) or any(w.job == job for w in self.state.queue)

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
        """The waiters that may go next: the group is not paused and none of
        their nodes is drained; in arrival order."""
        if self.state.paused:
            return []
        if not self.state.drained:
            return list(self.state.queue)
        drained = set(self.state.drained)
        return [
            waiter
            for waiter in self.state.queue
            if not drained.intersection(self.state.jobs[waiter.job].nodes)
        ]

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

    def _turn_limit_due(self) -> float | None:
        """When the holder was (or will be) first asked to yield for its turn
        limit: past the limit with someone waiting."""
        turn = self.state.turn
        limit = self.state.policy.max_turn_seconds
        eligible = self._eligible()
        if turn is None or limit <= 0 or not eligible:
            return None
        return max(turn.granted_at + limit, eligible[0].since)

    def _yield_due_reached(self, now: float) -> bool:
        due = self._turn_limit_due()
        return due is not None and now >= due

    def _charge(self, job: str, turn: StoredGrant, now: float) -> float:
        """Charge the job for the GPU time of its turn (switch time is no one's)."""
        held = max(0.0, now - turn.granted_at)
        entry = self.state.jobs[job]
        entry.held_seconds += held
        entry.share_seconds += held / entry.weight
        return held

    def _preempt(self, turn: StoredGrant, now: float) -> None:
        entry = self.state.jobs[turn.job]
        self._charge(turn.job, turn, now)
        entry.preempted = True
        self._end_turn(turn, now, "preempted")
        self.state.turn = None
        self.state.since = now
        self.state.preemptions += 1
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
                    _remember(self.state.aborted_requests, waiter.request_id, reason)
            _remember(self.state.evicted_jobs, job, reason)
        self.state.queue = [w for w in self.state.queue if w.job != job]
        self.state.released.pop(job, None)
        self.state.served_requests.pop(job, None)
        where = set(self.state.jobs[job].nodes)
        where |= {node for node, resident in self.state.resident.items() if resident == job}
        self.state.releasing[job] = sorted(where)
        del self.state.jobs[job]
        self._grant_ready(now)

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
            waiter = planned[0] if planned else waiter
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
