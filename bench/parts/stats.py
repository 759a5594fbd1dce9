"""Percentiles for benchmark tables."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def p50_p90_p99(values: Sequence[float]) -> tuple[float, float, float]:
    return percentile(values, 50), percentile(values, 90), percentile(values, 99)
