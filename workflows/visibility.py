"""What a group shows outside its workflow: search attributes, the current
details in the Temporal UI, the queue-depth gauge, and what its holders'
watches read in its memo (watch_memo.py), in the version of visibility its
run took (scheduling/versions.py)."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import MetricGauge, SearchAttributeKey, SearchAttributeUpdate

with workflow.unsafe.imports_passed_through():
    from timeshare.scheduling import versions
    from timeshare.scheduling.reporting import GroupSummary
    from timeshare.workflows.backfill_gauges import BackfillGauges
    from timeshare.workflows.ui_text import current_details
    from timeshare.workflows.watch_memo import memo_publisher

HOLDER = SearchAttributeKey.for_keyword("TimeshareHolder")
QUEUE_DEPTH = SearchAttributeKey.for_int("TimeshareQueueDepth")
STATE = SearchAttributeKey.for_keyword("TimeshareState")
# Registered by `timeshare temporal`; on another cluster, by the operator
# (deploy/temporal/values.yaml). The scheduler checks at start.
SEARCH_ATTRIBUTES = {HOLDER.name: "Keyword", QUEUE_DEPTH.name: "Int", STATE.name: "Keyword"}
# A failing switch's cause labels its gauge series; this much of it.
FAILING_CAUSE_CHARS = 200


class GroupVisibility:
    """Publishes what changed since the last call; call it after every change."""

    def __init__(self, version: int) -> None:
        """``version``: of what the run publishes (versions.VISIBILITY_*),
        fixed when it starts."""
        self.version = version
        self._memo = memo_publisher(version)
        self._shown: GroupSummary | None = None
        self._published: tuple[str, int, str] | None = None
        # Made once: each new gauge is a call into the SDK's core.
        self._queue_depth: MetricGauge | None = None
        self._switch_failing: MetricGauge | None = None
        # The cause whose series shows the attempts of the switch failing now.
        self._failing_shown: tuple[str, int] = ("", 0)
        self._backfill = BackfillGauges()

    @property
    def shown(self) -> GroupSummary | None:
        """The summary last published (None before the first)."""
        return self._shown

    def publish(self, summary: GroupSummary, asks: bool) -> None:
        """``asks``: the group decides by policies (its holders can be asked
        to yield)."""
        self._memo.publish(summary, asks)
        if summary == self._shown:
            return
        self._shown = summary
        shown = (summary.holder, len(summary.queue), summary.state)
        if shown != self._published and self._search_attributes():
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

    def _search_attributes(self) -> bool:
        """Upserted by every run (a run of the legacy version marks the
        deprecated patch where it asked it, at its first upsert)."""
        if self.version == versions.VISIBILITY_LEGACY:
            workflow.deprecate_patch(versions.SEARCH_ATTRIBUTES)
        return True

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
        # Only the attributes that changed (Temporal keeps the others).
        if self._published is not None:
            updates = [
                update
                for update, now, before in zip(updates, shown, self._published, strict=True)
                if now != before
            ]
        workflow.upsert_search_attributes(updates)
