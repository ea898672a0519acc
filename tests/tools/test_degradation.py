"""Degradation sentences: which tool, since when, when it is retried, what replaces it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tiermem.tools.breaker import BreakerPolicy, BreakerState, BreakerStatus, ToolHealth
from tiermem.tools.degradation import describe_degradation, format_duration, format_time

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
POLICY = BreakerPolicy(failure_threshold=4, window=timedelta(seconds=60))
OPEN = BreakerState(
    status=BreakerStatus.OPEN,
    opened_at=T0,
    retry_at=T0 + timedelta(seconds=30),
    last_error="timed out after 2 s",
)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (45.4, "45 s"),
        (119, "119 s"),
        (180, "3 min"),
        (7500, "2 h 5 min"),
        (7200, "2 h"),
        (3 * 86400, "3 d"),
        (-5, "0 s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(timedelta(seconds=seconds)) == text


def test_format_time_adds_the_date_only_on_another_day() -> None:
    assert format_time(T0, T0 + timedelta(hours=1)) == "12:00:00 UTC"
    assert format_time(T0, T0 + timedelta(days=1)) == "2030-01-01 12:00:00 UTC"


def test_open_tool_with_fallback() -> None:
    d = describe_degradation("search", OPEN, POLICY, T0 + timedelta(seconds=12), fallback="cache")
    assert d.health is ToolHealth.UNAVAILABLE
    assert (d.since, d.retry_at, d.fallback, d.probe_in_flight) == (
        T0,
        T0 + timedelta(seconds=30),
        "cache",
        False,
    )
    assert d.message == (
        "Tool 'search' is unavailable since 12:00:00 UTC (12 s ago) after repeated failures "
        "(last error: timed out after 2 s); it will be retried at 12:00:30 UTC (in 18 s). "
        "Using 'cache' instead."
    )


def test_open_tool_without_fallback_due_for_retry() -> None:
    d = describe_degradation("search", OPEN, POLICY, T0 + timedelta(minutes=5), fallback=None)
    assert d.message.endswith("it will be retried on the next call. No fallback is available.")
    assert "(5 min ago)" in d.message


def test_half_open_tool_says_a_check_is_running() -> None:
    state = replace(
        OPEN,
        status=BreakerStatus.HALF_OPEN,
        probe_id="p",
        probe_until=T0 + timedelta(seconds=60),
    )
    d = describe_degradation("search", state, POLICY, T0 + timedelta(seconds=31), fallback="cache")
    assert d.probe_in_flight
    assert "a recovery check is in progress. Using 'cache' instead." in d.message


def test_degraded_tool_counts_recent_failures() -> None:
    state = BreakerState(failures=(T0, T0 + timedelta(seconds=10)), last_error="HTTP 503")
    d = describe_degradation("search", state, POLICY, T0 + timedelta(seconds=20), fallback=None)
    assert d.health is ToolHealth.DEGRADED
    assert (d.since, d.recent_failures) == (T0, 2)
    assert d.message == (
        "Tool 'search' is degraded: 2 failures in the last 60 s (last error: HTTP 503); it is "
        "still called, and 4 failures in that time make it unavailable."
    )


def test_healthy_tool() -> None:
    d = describe_degradation("search", BreakerState(), POLICY, T0, fallback=None)
    assert (d.health, d.message) == (ToolHealth.HEALTHY, "Tool 'search' is healthy.")
