"""Rolling latency percentiles: nearest rank over a bounded window."""

from __future__ import annotations

import pytest

from tiermem.errors import ValidationError
from tiermem.tools.latency import LatencyWindow, nearest_rank


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([7.0], 0.5, 7.0),
        ([1.0, 2.0], 0.5, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
        ([float(i) for i in range(1, 101)], 0.95, 95.0),
        ([float(i) for i in range(1, 101)], 0.99, 99.0),
        ([float(i) for i in range(1, 11)], 0.99, 10.0),
    ],
)
def test_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert nearest_rank(values, q) == expected


def test_empty_window_has_no_percentiles() -> None:
    summary = LatencyWindow().summary()
    assert (summary.samples, summary.p50_ms, summary.p99_ms) == (0, None, None)


def test_window_keeps_only_the_last_calls() -> None:
    window = LatencyWindow(size=100)
    for ms in range(1, 1001):  # 1..1000 ms; only 901..1000 remain
        window.add(float(ms))
    assert len(window) == 100
    summary = window.summary()
    assert (summary.samples, summary.p50_ms, summary.p95_ms, summary.p99_ms) == (
        100,
        950.0,
        995.0,
        999.0,
    )


def test_slow_outliers_show_in_p99_not_p50() -> None:
    window = LatencyWindow(size=1000)
    for i in range(1000):
        window.add(2000.0 if i % 50 == 0 else 12.0)  # 2 % slow
    summary = window.summary()
    assert (summary.p50_ms, summary.p95_ms, summary.p99_ms) == (12.0, 12.0, 2000.0)


def test_window_size_must_be_positive() -> None:
    with pytest.raises(ValidationError):
        LatencyWindow(size=0)
