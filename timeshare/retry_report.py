"""A call the client sends again and again (an acquire or a join while the
gateway, Temporal or the scheduler does not answer) is said in the log once
it has gone on a while, then now and then: a job that waits on a failing
stack is never silent about why."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from timeshare.errors import TimeshareError

log = logging.getLogger("timeshare")

# A gateway restart or a short pause passes within this, unreported.
REPORT_AFTER_SECONDS = 10.0
REPORT_EVERY_SECONDS = 60.0


@dataclass
class RetryReport:
    job: str
    call: str
    started: float
    reported_at: float | None = None

    def failed(self, error: TimeshareError, now: float) -> None:
        """The call failed again with ``error`` and will be sent again."""
        if now - self.started < REPORT_AFTER_SECONDS:
            return
        if self.reported_at is not None and now - self.reported_at < REPORT_EVERY_SECONDS:
            return
        self.reported_at = now
        log.warning(
            "job %r: %s still refused after %.0f s, sending it again: %s",
            self.job, self.call, now - self.started, error,
        )  # fmt: skip
