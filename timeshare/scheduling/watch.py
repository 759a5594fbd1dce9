"""What the holder of a group's turn must hear while it holds it, as the
core says it: one versioned record, which the group publishes in its memo
(workflows/visibility.py) and a gateway's turn watch relays
(workers/gateway/turn_watch.py) without working anything out itself.

The holder and the number of jobs waiting are published as search
attributes beside it (what `temporal workflow list` shows); this record says
the rest: whether (and from when) the holder of a turn is asked to yield,
how many of those waiting are backfill jobs, and how often a watch must
look again. It is written only when it changes, and a group whose holders
are never asked to yield writes it once, when it starts (its creator sets
it: ``for_policy``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict

# The memo key of the record.
MEMO_KEY = "watch"
RECORD_VERSION = 1
# The pace of a watch in a group whose policy can ask a holder to yield (a
# turn limit, preemption by priority). Such a watch hears its news pushed
# (``hears_pushed``) and polls at this pace only where the scheduler cannot
# push: the ask is heard within it, plus a round trip.
POLL_SECONDS = 0.25
# In any other group a watch only tells the holder that others wait, so
# that it renews its lease: polled this often, or a sixth of the lease,
# whichever is sooner. A pushed watch polls this often, as a keepalive.
SLOW_POLL_SECONDS = 5.0
# A backfill job's turn watched where the scheduler cannot push: every
# moment the backfill job holds on after a regular job asks is a moment the
# regular job waits.
BACKFILL_POLL_SECONDS = 0.05
NOT_ASKED = (0, 0.0)


class Policy(Protocol):
    """What of a group's policy (GroupPolicy, or the stored one) sets the pace."""

    @property
    def max_turn_seconds(self) -> float: ...
    @property
    def preempt_lower_after_seconds(self) -> float: ...
    @property
    def lease_seconds(self) -> float: ...


def poll_seconds(policy: Policy) -> float:
    """How often a watch of a group with this policy looks again."""
    asks = policy.max_turn_seconds > 0 or policy.preempt_lower_after_seconds > 0
    if asks:
        return POLL_SECONDS
    return max(POLL_SECONDS, min(SLOW_POLL_SECONDS, policy.lease_seconds / 6))


@dataclass(frozen=True)
class HolderNotice:
    """What one watch tells its job now (the TurnNotice of the public API)."""

    holding: bool
    epoch: int
    waiting: int
    should_yield: bool
    only_backfill_waiting: bool


class WatchRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    version: int = RECORD_VERSION
    # (epoch, from when): the holder of the turn of that epoch (the epoch its
    # job was told) is asked to yield from that moment, in seconds since the
    # Unix epoch, by the watch's own clock (0.0: now). NOT_ASKED: nobody is.
    yield_asked: tuple[int, float] = NOT_ASKED
    # Of the jobs waiting, backfill jobs: none of them goes before a regular
    # holder's next phase.
    backfill_waiting: int = 0
    # How soon a watch looks again: of a regular job's turn, of a backfill job's.
    poll_seconds: float = SLOW_POLL_SECONDS
    backfill_poll_seconds: float = BACKFILL_POLL_SECONDS

    @classmethod
    def for_policy(cls, policy: Policy) -> WatchRecord:
        """The record of a group that has just begun (its creator sets it)."""
        return cls(poll_seconds=poll_seconds(policy))

    def asked_from(self, holder: str, job: str, epoch: int) -> float | None:
        """From when ``job``'s turn of ``epoch`` is asked to yield, if it holds
        that turn and is asked (0.0: now)."""
        asked_epoch, at = self.yield_asked
        return at if holder == job and epoch and asked_epoch == epoch else None

    def notice(
        self, holder: str, waiting: int, job: str, epoch: int, backfill: bool, now: float
    ) -> HolderNotice:
        """What the watch of ``job``'s turn of ``epoch`` tells it at ``now``,
        the group's holder and queue depth being ``holder`` and ``waiting``
        (``backfill``: the job is a backfill job, which any waiter may go before)."""
        holding = holder == job
        asked = self.asked_from(holder, job, epoch)
        return HolderNotice(
            holding=holding,
            epoch=epoch,
            waiting=waiting,
            should_yield=asked is not None and now >= asked,
            only_backfill_waiting=holding and not backfill and 0 < waiting <= self.backfill_waiting,
        )

    def look_again(self, backfill: bool) -> float:
        return self.backfill_poll_seconds if backfill else self.poll_seconds

    def says_the_same(self, other: WatchRecord | None, holder_epoch: int) -> bool:
        """Whether publishing this record instead of ``other`` would tell no
        watch anything new: it only drops a moment still to come that was
        set for a turn that has ended (the group asks that holder itself
        now, or its turn ended)."""
        if other is None or self == other:
            return self == other
        asked_epoch, at = other.yield_asked
        dropped = self.yield_asked == NOT_ASKED and at > 0 and asked_epoch != holder_epoch
        return dropped and self.model_copy(update={"yield_asked": other.yield_asked}) == other

    @classmethod
    def from_legacy_memo(
        cls,
        yield_epoch: int,
        backfill_waiting: int,
        backfill_yield_at: tuple[int, float],
        poll_seconds: float,
    ) -> WatchRecord:
        """The record a run from before it (versions.VISIBILITY_LEGACY)
        published as three memo keys: the epoch asked to yield now, the
        backfill jobs waiting, and (epoch, when) a backfill holder is to be
        asked ahead of a predicted request."""
        asked = (yield_epoch, 0.0) if yield_epoch else backfill_yield_at
        return cls(yield_asked=asked, backfill_waiting=backfill_waiting, poll_seconds=poll_seconds)


class TurnAsk(BaseModel):
    """A gateway's wait for the group's news to the holder of ``job``'s turn
    of ``epoch`` (the group workflow's ``watch_turn`` update): that it is
    asked to yield, or from when; that others now wait, or no longer do; or
    that the turn ended. The watch hears it pushed, not by polling. The
    other fields are what the gateway last read: ``asked_from``
    (``WatchRecord.asked_from``; None: not asked) and ``waiting`` (whether
    any job waited; None: not news to this watch, which polls for it)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    job: str
    epoch: int
    asked_from: float | None = None
    waiting: bool | None = None

    def holds(self, holder: str, holder_epoch: int) -> bool:
        """Whether the turn watched is the group's turn now."""
        return holder == self.job and holder_epoch == self.epoch

    def news(self, record: WatchRecord, holder: str, holder_epoch: int, waiting: int) -> bool:
        """Whether the group (its record, holder, holder's epoch and number of
        jobs waiting) says something new to this turn's holder."""
        if not self.holds(holder, holder_epoch):
            return True
        asked = record.asked_from(holder, self.job, self.epoch)
        if asked != self.asked_from:
            return True
        return self.waiting is not None and (waiting > 0) != self.waiting


def hears_pushed(policy_poll_seconds: float, backfill: bool) -> bool:
    """Whether a watch hears its group's news pushed: a backfill job's turn,
    and any turn in a group whose policy can ask a holder to yield (polled
    at ``POLL_SECONDS`` otherwise). Elsewhere nothing is asked of a regular
    holder, and a poll every few seconds costs less than an update per turn."""
    return backfill or asks(policy_poll_seconds)


def asks(policy_poll_seconds: float) -> bool:
    """Whether the group's policy can ask a regular holder to yield. Its
    pushed watches hear that others wait pushed too, and poll only as a
    keepalive; elsewhere a pushed (backfill) watch hears it at the group's
    pace, which follows the lease."""
    return policy_poll_seconds <= POLL_SECONDS
