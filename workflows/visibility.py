"""What a group shows outside its workflow: search attributes, the current
details in the Temporal UI, and the queue-depth gauge."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import MetricGauge, SearchAttributeKey, SearchAttributeUpdate

with workflow.unsafe.imports_passed_through():
    from timeshare.scheduling.reporting import GroupSummary
    from timeshare.workflows.backfill_gauges import BackfillGauges
    from timeshare.workflows.ui_text import current_details

HOLDER = SearchAttributeKey.for_keyword("TimeshareHolder")
QUEUE_DEPTH = SearchAttributeKey.for_int("TimeshareQueueDepth")
STATE = SearchAttributeKey.for_keyword("TimeshareState")
# Registered by `timeshare temporal`; on another cluster, by the operator
# (deploy/temporal/values.yaml). The scheduler checks at start.
SEARCH_ATTRIBUTES = {HOLDER.name: "Keyword", QUEUE_DEPTH.name: "Int", STATE.name: "Keyword"}
# Workflows started before search attributes existed replay without them.
PATCH = "timeshare-search-attributes"
# From this change on, an upsert carries only the attributes that changed
# (Temporal keeps the others), and a switch like the group's last quick ones
# is not shown as `switching` (GroupWorkflow._switch): a hand-over writes one
# upsert fewer, and a prefetch none.
LEAN_PATCH = "timeshare-lean-search-attributes"
# The memo key a holder's watch reads (workers/gateway/turn_watch.py): the epoch whose
# holder is asked to yield, 0 for none. Written only when it changes, so a
# group whose holders are never asked to yield writes it never.
YIELD_EPOCH_MEMO = "yield_epoch"
# A run continued as new inherits its memo, yield_epoch included, while runs
# before this change believed they started with 0 published: one that was
# asked to yield when the last run ended, and is no longer asked, kept saying
# so. From this change on such a run writes 0 (asked only where they differ).
CARRIED_MEMO_PATCH = "timeshare-carried-yield-epoch"
# The memo key a regular holder's watch reads beside the queue depth: how
# many of the jobs waiting are backfill jobs. None of them goes before a
# regular holder's next phase, so while they are all that wait, it keeps its
# turn without waiting for an answer (Job.next_turn_nowait). Written only when
# it changes: never in a group without backfill jobs. Runs from before this
# change never write it, and their holders ask for every next phase.
BACKFILL_WAITING_MEMO = "backfill_waiting"
BACKFILL_WAITING_PATCH = "timeshare-backfill-waiting-memo"
# The memo key a backfill holder's watch reads: [epoch, when] the group is to
# ask that turn's holder to yield ahead of a predicted request, so that the
# watch asks it at that moment by its gateway's clock, not after the
# workflow's timer rings (Temporal fires none sooner than its timer floor
# after it is set: docs/facts.md). Written when a new moment is set, or one
# still to come is taken back; a stale one names an epoch that ended.
BACKFILL_YIELD_AT_MEMO = "backfill_yield_at"
BACKFILL_YIELD_AT_PATCH = "timeshare-backfill-yield-at-memo"
# A failing switch's cause labels its gauge series; this much of it.
FAILING_CAUSE_CHARS = 200


def yield_at_from_memo(memo: list[float]) -> tuple[int, float]:
    epoch, at = memo
    return int(epoch), at


class GroupVisibility:
    """Publishes what changed since the last call; call it after every change."""

    def __init__(
        self,
        lean: bool = False,
        carried_yield_epoch: int = 0,
        carried_backfill_waiting: int = 0,
        carried_backfill_yield_at: tuple[int, float] = (0, 0.0),
    ) -> None:
        """``lean``: LEAN_PATCH applies to this run. ``carried_*``: what the
        memo said when this run started (the last run's, after a
        continue-as-new)."""
        self.lean = lean
        self._shown: GroupSummary | None = None
        self._published: tuple[str, int, str] | None = None
        self._yield_epoch = 0
        self._carried_yield_epoch = carried_yield_epoch
        self._backfill_waiting = carried_backfill_waiting
        self._backfill_yield_at = carried_backfill_yield_at
        # Made once: each new gauge is a call into the SDK's core.
        self._queue_depth: MetricGauge | None = None
        self._switch_failing: MetricGauge | None = None
        # The cause whose series shows the attempts of the switch failing now.
        self._failing_shown: tuple[str, int] = ("", 0)
        self._backfill = BackfillGauges()

    def publish(self, summary: GroupSummary, yield_epoch: int | None = None) -> None:
        """``yield_epoch`` None: a group from before yield requests were
        published (its history has no memo to replay)."""
        if yield_epoch is not None and self._carried_yield_epoch:
            # Only the first publish of a run looks at the carried memo.
            carried, self._carried_yield_epoch = self._carried_yield_epoch, 0
            if yield_epoch == 0 and workflow.patched(CARRIED_MEMO_PATCH):
                self._yield_epoch = carried
        if yield_epoch is not None and yield_epoch != self._yield_epoch:
            workflow.upsert_memo({YIELD_EPOCH_MEMO: yield_epoch})
            self._yield_epoch = yield_epoch
        self._publish_backfill_waiting(summary)
        self._publish_backfill_yield_at(summary)
        if summary == self._shown:
            return
        self._shown = summary
        shown = (summary.holder, len(summary.queue), summary.state)
        if shown != self._published and workflow.patched(PATCH):
            self._upsert(shown)
            if self._queue_depth is None:
                self._queue_depth = (
                    workflow.metric_meter()
                    .with_additional_attributes({"group": summary.group})
                    .create_gauge("timeshare.queue.depth", "Jobs waiting for the turn", "{job}")
                )
            self._queue_depth.set(len(summary.queue))
            self._published = shown
        self._show_switch_failing(summary)
        self._backfill.publish(summary)
        workflow.set_current_details(current_details(summary))

    def _publish_backfill_waiting(self, summary: GroupSummary) -> None:
        waiting = sum(job in summary.backfill for job in summary.queue)
        if waiting != self._backfill_waiting and workflow.patched(BACKFILL_WAITING_PATCH):
            workflow.upsert_memo({BACKFILL_WAITING_MEMO: waiting})
            self._backfill_waiting = waiting

    def _publish_backfill_yield_at(self, summary: GroupSummary) -> None:
        due, published = summary.backfill_yield_due, self._backfill_yield_at
        if due == published:
            return
        epoch = published[0]
        if due == (0, 0.0) and (summary.yield_epoch == epoch or summary.holder_epoch != epoch):
            return  # the group asks that holder itself now, or its turn ended
        if workflow.patched(BACKFILL_YIELD_AT_PATCH):
            workflow.upsert_memo({BACKFILL_YIELD_AT_MEMO: list(due)})
            self._backfill_yield_at = due

    def _show_switch_failing(self, summary: GroupSummary) -> None:
        """The gauge of a failing switch: its attempts so far, under its cause
        (one series per cause; back to 0 once the switch works or is given up)."""
        shown = (summary.failing_cause[:FAILING_CAUSE_CHARS], summary.failing_attempts)
        if shown == self._failing_shown:
            return
        if self._switch_failing is None:
            self._switch_failing = (
                workflow.metric_meter()
                .with_additional_attributes({"group": summary.group})
                .create_gauge(
                    "timeshare.switch.failing",
                    "Attempts of the group's switch failing now, by cause (0: none fails)",
                    "{attempt}",
                )
            )
        before_cause, _ = self._failing_shown
        if before_cause and before_cause != shown[0]:
            self._switch_failing.set(0, {"cause": before_cause})
        if shown[0]:
            self._switch_failing.set(shown[1], {"cause": shown[0]})
        self._failing_shown = shown

    def _upsert(self, shown: tuple[str, int, str]) -> None:
        holder, depth, state = shown
        updates: list[SearchAttributeUpdate[Any]] = [
            HOLDER.value_set(holder or "-"),
            QUEUE_DEPTH.value_set(depth),
            STATE.value_set(state),
        ]
        if self.lean and self._published is not None:
            updates = [
                update
                for update, now, before in zip(updates, shown, self._published, strict=True)
                if now != before
            ]
        workflow.upsert_search_attributes(updates)
