"""Sentences an agent can reason about when a tool is unavailable or failing.

Pure: a breaker state, the time and the fallback in, a :class:`Degradation` out. The
sentence says which tool, since when, when it will be tried again and what is used instead,
for example::

    Tool 'search_catalog' is unavailable since 12:00:03 UTC (45 s ago) after repeated
    failures (last error: timed out after 2 s); it will be retried at 12:00:33 UTC (in 15 s).
    Using 'cached_catalog' instead.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tiermem.models import FrozenModel, UtcDatetime
from tiermem.tools.breaker import (
    BreakerPolicy,
    BreakerState,
    BreakerStatus,
    ToolHealth,
    recent_failures,
    tool_health,
)

__all__ = ["Degradation", "describe_degradation", "format_duration", "format_time"]


class Degradation(FrozenModel):
    """Why a tool was not used (or is failing), and what replaced it."""

    tool: str
    health: ToolHealth
    status: BreakerStatus
    since: UtcDatetime | None = None
    """Start of the outage (open / half-open), or of the oldest recent failure (degraded)."""
    retry_at: UtcDatetime | None = None
    probe_in_flight: bool = False
    recent_failures: int = 0
    last_error: str | None = None
    fallback: str | None = None
    """The tool used instead; None when nothing replaced it."""
    message: str
    """One or two sentences for the agent (and a human reading the logs)."""


def format_duration(delta: timedelta) -> str:
    """A short human duration: ``45 s``, ``3 min``, ``2 h 5 min``, ``3 d``."""
    seconds = max(0, round(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} d"


def format_time(value: datetime, now: datetime) -> str:
    """``12:00:03 UTC``, with the date when it is not ``now``'s day."""
    if value.date() == now.date():
        return value.strftime("%H:%M:%S UTC")
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _last_error(state: BreakerState) -> str:
    return f" (last error: {state.last_error})" if state.last_error else ""


def _replacement(fallback: str | None) -> str:
    if fallback is None:
        return "No fallback is available."
    return f"Using {fallback!r} instead."


def describe_degradation(
    tool: str,
    state: BreakerState,
    policy: BreakerPolicy,
    now: datetime,
    *,
    fallback: str | None,
) -> Degradation:
    """Describe ``tool`` at ``now``; ``fallback`` is the tool that replaced it (or None).

    A closed breaker with recent failures reads as degraded; a healthy one gets a plain
    "is healthy" message (callers normally only describe tools that are not).
    """
    health = tool_health(state, policy, now)
    failures = recent_failures(state, policy, now)
    base = {
        "tool": tool,
        "health": health,
        "status": state.status,
        "retry_at": state.retry_at,
        "recent_failures": len(failures),
        "last_error": state.last_error,
        "fallback": fallback,
    }
    if health is ToolHealth.UNAVAILABLE:
        since = state.opened_at or now
        probing = (
            state.status is BreakerStatus.HALF_OPEN
            and state.probe_until is not None
            and now < state.probe_until
        )
        head = (
            f"Tool {tool!r} is unavailable since {format_time(since, now)} "
            f"({format_duration(now - since)} ago) after repeated failures{_last_error(state)}"
        )
        if probing:
            when = "a recovery check is in progress"
        elif state.retry_at is not None and state.retry_at > now:
            when = (
                f"it will be retried at {format_time(state.retry_at, now)} "
                f"(in {format_duration(state.retry_at - now)})"
            )
        else:
            when = "it will be retried on the next call"
        message = f"{head}; {when}. {_replacement(fallback)}"
        return Degradation(**base, since=since, probe_in_flight=probing, message=message)
    if health is ToolHealth.DEGRADED:
        message = (
            f"Tool {tool!r} is degraded: {len(failures)} failures in the last "
            f"{format_duration(policy.window)}{_last_error(state)}; it is still called, and "
            f"{policy.failure_threshold} failures in that time make it unavailable."
        )
        return Degradation(**base, since=failures[0], message=message)
    return Degradation(**base, message=f"Tool {tool!r} is healthy.")
