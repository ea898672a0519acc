"""Rolling latency percentiles over a bounded window of recent calls.

The window keeps the last ``size`` durations and nothing else, so memory stays bounded
however long a worker runs; percentiles use the nearest-rank method on a sorted copy, which
costs O(size log size) per summary and nothing per call beyond an append.
"""

from __future__ import annotations

import math
from collections import deque

from tiermem.errors import ValidationError
from tiermem.models import FrozenModel

__all__ = ["DEFAULT_LATENCY_WINDOW", "LatencySummary", "LatencyWindow", "nearest_rank"]

DEFAULT_LATENCY_WINDOW = 1024
"""Calls per tool the percentiles are computed over."""


class LatencySummary(FrozenModel):
    """Percentiles of the window, in milliseconds; None while the window is empty."""

    samples: int
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None


def nearest_rank(ordered: list[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1) of an ascending, non-empty list: the smallest value
    with at least ``q`` of the values at or below it."""
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


class LatencyWindow:
    """The last ``size`` call durations of one tool.

    Raises:
        ValidationError: ``size`` below 1.
    """

    def __init__(self, size: int = DEFAULT_LATENCY_WINDOW) -> None:
        if size < 1:
            raise ValidationError(f"a latency window needs a size >= 1, got {size}")
        self._values: deque[float] = deque(maxlen=size)

    def __len__(self) -> int:
        return len(self._values)

    def add(self, duration_ms: float) -> None:
        """Record one call's duration; the oldest falls out when the window is full."""
        self._values.append(duration_ms)

    def summary(self) -> LatencySummary:
        if not self._values:
            return LatencySummary(samples=0)
        ordered = sorted(self._values)
        return LatencySummary(
            samples=len(ordered),
            p50_ms=round(nearest_rank(ordered, 0.50), 3),
            p95_ms=round(nearest_rank(ordered, 0.95), 3),
            p99_ms=round(nearest_rank(ordered, 0.99), 3),
        )
