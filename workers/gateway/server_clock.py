"""The history hosts' clock as a gateway reads it.

A group publishes some moments by its own clock (the workflow's time, the
history host's): when a backfill holder is to be asked to yield, when a
node's GPU claim lapses. A gateway acts on them by its own clock, so a
gateway whose clock runs ahead would ask early, one behind would ask late.

Every grant the gateway relays says when the group made it (``granted_at``,
the history host's time) and reaches the gateway after that, never before:
its arrival minus ``granted_at`` is the gateway's clock minus theirs, plus
how long the grant took to arrive. The smallest of these over recent grants
is the offset, to within the quickest delivery (a few milliseconds here);
``now()`` is the gateway's clock less it. A gateway that has relayed no
grant yet takes its own clock as it is."""

from __future__ import annotations

import logging
import time
from collections import deque

log = logging.getLogger("timeshare.gateway")

# Grants remembered (their arrivals and offsets), and for how long: a clock
# set right (NTP) is trusted again within that long.
SAMPLES = 256
SAMPLE_SECONDS = 600.0
# An offset this large is worth a line in the log (an NTP problem to fix),
# and a change of it by this much another.
NOTEWORTHY_SECONDS = 0.1


class ServerClock:
    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=SAMPLES)
        self._told = 0.0

    def note(self, granted_at: float, arrived_at: float | None = None) -> None:
        """A grant made at ``granted_at`` (the group's time) arrived now."""
        arrived = time.time() if arrived_at is None else arrived_at
        if granted_at > 0:
            self._samples.append((arrived, arrived - granted_at))
            self._tell()

    def _tell(self) -> None:
        offset = self.offset
        worth = abs(offset) >= NOTEWORTHY_SECONDS or abs(self._told) >= NOTEWORTHY_SECONDS
        if worth and abs(offset - self._told) >= NOTEWORTHY_SECONDS:
            way = "ahead of" if offset > 0 else "behind"
            log.warning(
                "this gateway's clock runs %.3f s %s the Temporal history hosts' (learned from "
                "the grants it relays); it reads the groups' moments by theirs. Check NTP here",
                abs(offset), way,
            )  # fmt: skip
            self._told = offset

    @property
    def offset(self) -> float:
        """How far the gateway's clock runs ahead of the history hosts' (negative: behind)."""
        recent = time.time() - SAMPLE_SECONDS
        while self._samples and self._samples[0][0] < recent:
            self._samples.popleft()
        return min((offset for _, offset in self._samples), default=0.0)

    def now(self) -> float:
        return time.time() - self.offset
