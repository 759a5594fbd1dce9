"""What a group writes in its memo for its holders' watches
(workers/gateway/turn_watch.py), in the version of visibility its run took
(scheduling/versions.py):

- ``RecordMemo`` (VISIBILITY_RECORD): the core's one versioned record
  (scheduling/watch.py), written whenever it says something new;
- ``LegacyMemo`` (VISIBILITY_LEGACY): the three keys of runs that began
  before the record, each behind a patch of its own. A history of such a
  run replays with the same writes; the run takes the record once it
  continues as new.

A run continued as new inherits its memo: each starts from what it carried."""

from __future__ import annotations

from typing import Any, Protocol

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from timeshare.scheduling import versions
    from timeshare.scheduling.reporting import GroupSummary
    from timeshare.scheduling.watch import MEMO_KEY, WatchRecord

# The legacy keys. The epoch whose holder is asked to yield, 0 for none.
YIELD_EPOCH_MEMO = "yield_epoch"
# How many of the jobs waiting are backfill jobs.
BACKFILL_WAITING_MEMO = "backfill_waiting"
# [epoch, when] the group is to ask that turn's holder, a backfill job, to
# yield ahead of a predicted request (a stale one names an epoch that ended).
BACKFILL_YIELD_AT_MEMO = "backfill_yield_at"
LEGACY_KEYS = (YIELD_EPOCH_MEMO, BACKFILL_WAITING_MEMO, BACKFILL_YIELD_AT_MEMO)
# The key a group's creator set to its watches' pace before the record said it.
WATCH_POLL_MEMO = "watch_poll_seconds"


class MemoPublisher(Protocol):
    def publish(self, summary: GroupSummary, asks: bool) -> None:
        """``asks``: the group decides by policies (its holders can be asked
        to yield; a legacy run of a group from before them writes none)."""


def memo_publisher(version: int) -> MemoPublisher:
    """The memo writer of this run's version of visibility, from what its memo carried."""
    if version >= versions.VISIBILITY_RECORD:
        carried = workflow.memo_value(MEMO_KEY, None, type_hint=WatchRecord)
        legacy = any(key in workflow.memo() for key in LEGACY_KEYS)
        return RecordMemo(carried, legacy)
    return LegacyMemo(
        carried_yield_epoch=workflow.memo_value(YIELD_EPOCH_MEMO, 0, type_hint=int),
        carried_backfill_waiting=workflow.memo_value(BACKFILL_WAITING_MEMO, 0, type_hint=int),
        carried_backfill_yield_at=yield_at_from_memo(
            workflow.memo_value(BACKFILL_YIELD_AT_MEMO, [0, 0.0], type_hint=list[float])
        ),
    )


class RecordMemo:
    def __init__(self, carried: WatchRecord | None, carried_legacy: bool = False) -> None:
        self._published = carried
        # The legacy keys a run of an older scheduler left: removed with the first write.
        self._legacy = carried_legacy

    def publish(self, summary: GroupSummary, asks: bool) -> None:
        record = summary.watch
        if record.says_the_same(self._published, summary.holder_epoch):
            return
        update: dict[str, Any] = {MEMO_KEY: record}
        if self._legacy:
            update |= dict.fromkeys(LEGACY_KEYS)
            self._legacy = False
        workflow.upsert_memo(update)
        self._published = record


def yield_at_from_memo(memo: list[float]) -> tuple[int, float]:
    epoch, at = memo
    return int(epoch), at


class LegacyMemo:
    def __init__(
        self,
        carried_yield_epoch: int = 0,
        carried_backfill_waiting: int = 0,
        carried_backfill_yield_at: tuple[int, float] = (0, 0.0),
    ) -> None:
        self._yield_epoch = 0
        self._carried_yield_epoch = carried_yield_epoch
        self._backfill_waiting = carried_backfill_waiting
        self._backfill_yield_at = carried_backfill_yield_at

    def publish(self, summary: GroupSummary, asks: bool) -> None:
        if asks:
            self._publish_yield_epoch(summary.yield_epoch)
        self._publish_backfill_waiting(summary)
        self._publish_backfill_yield_at(summary)

    def _publish_yield_epoch(self, yield_epoch: int) -> None:
        if self._carried_yield_epoch:
            # Only the first publish of a run looks at the carried memo: from
            # its patch on, a run that carried an epoch asked to yield writes
            # 0 once that holder is no longer asked.
            carried, self._carried_yield_epoch = self._carried_yield_epoch, 0
            if yield_epoch == 0 and workflow.patched(versions.CARRIED_YIELD_EPOCH):
                self._yield_epoch = carried
        if yield_epoch != self._yield_epoch:
            workflow.upsert_memo({YIELD_EPOCH_MEMO: yield_epoch})
            self._yield_epoch = yield_epoch

    def _publish_backfill_waiting(self, summary: GroupSummary) -> None:
        waiting = summary.watch.backfill_waiting
        if waiting != self._backfill_waiting and workflow.patched(versions.BACKFILL_WAITING_MEMO):
            workflow.upsert_memo({BACKFILL_WAITING_MEMO: waiting})
            self._backfill_waiting = waiting

    def _publish_backfill_yield_at(self, summary: GroupSummary) -> None:
        due, published = summary.backfill_yield_due, self._backfill_yield_at
        if due == published:
            return
        epoch = published[0]
        if due == (0, 0.0) and (summary.yield_epoch == epoch or summary.holder_epoch != epoch):
            return  # the group asks that holder itself now, or its turn ended
        if workflow.patched(versions.BACKFILL_YIELD_AT_MEMO):
            workflow.upsert_memo({BACKFILL_YIELD_AT_MEMO: list(due)})
            self._backfill_yield_at = due
