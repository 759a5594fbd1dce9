"""What Temporal's server does for a load: its own Prometheus counters of
requests to each of its services, to its store and to its visibility store
(`temporal server start-dev --metrics-port`, which timeshare.testing.stack
turns on), read before and after a window, so a benchmark can say what one
hand-over costs the server.

The dev server runs every service in one process, so one client call counts
in each service it passes through (an update: frontend, then history); the
rows keep the services apart.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

SAMPLE = re.compile(
    r"^(service_requests|persistence_requests|visibility_persistence_requests)\{([^}]*)\} (\S+)$"
)
LABEL = re.compile(r'(\w+)="([^"]*)"')
# (metric, service, operation)
Key = tuple[str, str, str]


def parse(text: str) -> Counter[Key]:
    """The request counters in a Prometheus text page, summed over namespaces."""
    counts: Counter[Key] = Counter()
    for line in text.splitlines():
        sample = SAMPLE.match(line)
        if sample is None:
            continue
        labels = dict(LABEL.findall(sample.group(2)))
        key = (sample.group(1), labels.get("service_name", ""), labels.get("operation", ""))
        counts[key] += int(float(sample.group(3)))
    return counts


def read(port: int) -> Counter[Key]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        return parse(page.read().decode())


class TemporalOperations:
    """The server's requests over a window (``window()``); ``counts`` stays
    empty, and ``error`` says why, when its metrics cannot be read."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.counts: Counter[Key] = Counter()
        self.error = ""

    @contextmanager
    def window(self) -> Iterator[None]:
        before = self._read()
        yield
        after = self._read()
        if before is not None and after is not None:
            after.subtract(before)
            self.counts = +after

    def _read(self) -> Counter[Key] | None:
        try:
            return read(self.port)
        except (urllib.error.URLError, OSError) as error:
            self.error = f"Temporal's metrics on port {self.port}: {error}"
            return None

    def total(self, metric: str, service: str = "") -> int:
        return sum(
            n
            for (m, s, _), n in self.counts.items()
            if m == metric and (not service or s == service)
        )

    def count(self, metric: str, service: str, operation: str) -> int:
        return self.counts[(metric, service, operation)]

    def rows(self, per: int, least: float = 0.05) -> list[list[str]]:
        """The operations that ran at least ``least`` times per ``per``
        events, busiest first: [metric, service, operation, count per event]."""
        ranked = [(key, n / max(1, per)) for key, n in self.counts.most_common()]
        return [[m, s, op, f"{rate:.2f}"] for (m, s, op), rate in ranked if rate >= least]
