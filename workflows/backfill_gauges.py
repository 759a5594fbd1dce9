"""The gauges of a group's backfill jobs: their GPU time, their preemptions,
and the seconds regular jobs waited while one of them held the turn. Each is
the group's total since it began (carried over continue-as-new), so a
dashboard takes its increase over a window, as with a counter."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import MetricGaugeFloat

with workflow.unsafe.imports_passed_through():
    from timeshare.scheduling.reporting import GroupSummary

# Named with their unit and given none, as the queue-depth gauge: the
# exporter then writes each name as it is, dots made underscores.
GAUGES = {
    "timeshare.backfill.busy_seconds": "Seconds backfill jobs held the turn",
    "timeshare.backfill.preemptions": (
        "Backfill holders preempted for not yielding within the grace"
    ),
    "timeshare.backfill.delay_seconds": (
        "Seconds regular jobs waited while a backfill job held the turn"
    ),
}


def totals(summary: GroupSummary) -> tuple[float, float, float]:
    return (
        summary.backfill_busy_seconds,
        float(summary.backfill_preemptions),
        summary.backfill_delay_seconds,
    )


class BackfillGauges:
    """Sets the gauges when a total changes; a group that never had a backfill
    job publishes none."""

    def __init__(self) -> None:
        self._gauges: list[MetricGaugeFloat] = []
        self._shown = (0.0, 0.0, 0.0)

    def publish(self, summary: GroupSummary) -> None:
        shown = totals(summary)
        if shown == self._shown:
            return
        if not self._gauges:
            meter = workflow.metric_meter().with_additional_attributes({"group": summary.group})
            self._gauges = [
                meter.create_gauge_float(name, description) for name, description in GAUGES.items()
            ]
        for gauge, value in zip(self._gauges, shown, strict=True):
            gauge.set(value)
        self._shown = shown
