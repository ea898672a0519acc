"""Invocation tracking: one record per call, calls in flight, and per-tool statistics.

Everything here is per process and bounded: the in-flight table holds only running calls,
the recent records and each tool's latency window keep a fixed number of entries. Breaker
state is what workers share (:mod:`tiermem.tools.breaker_store`); statistics are not.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from pydantic import Field

from tiermem.models import FrozenModel, JsonValue, UtcDatetime
from tiermem.tools.invoker import ToolOutput
from tiermem.tools.latency import DEFAULT_LATENCY_WINDOW, LatencySummary, LatencyWindow

__all__ = [
    "DEFAULT_RECENT_LIMIT",
    "InFlight",
    "InvocationOutcome",
    "InvocationTracker",
    "ToolInvocation",
    "ToolStats",
]

DEFAULT_RECENT_LIMIT = 256
"""How many finished invocations a tracker keeps for inspection."""


class InvocationOutcome(StrEnum):
    SUCCESS = "success"
    ERROR = "error"
    """The tool reported an error, or the call could not be made."""
    TIMEOUT = "timeout"


class ToolInvocation(FrozenModel):
    """One call of one tool, finished."""

    request_id: str
    """The id of the agent's request; every attempt of one request shares it."""
    attempt: int = Field(ge=0)
    """0 for the tool asked for, then 1, 2... for the fallbacks tried, in order."""
    tool: str
    requested_tool: str
    probe: bool = False
    """The call was the half-open breaker's recovery probe."""
    arguments: dict[str, JsonValue]
    started_at: UtcDatetime
    finished_at: UtcDatetime
    duration_ms: float
    outcome: InvocationOutcome
    output: ToolOutput | None = None
    """The answer on success; on a tool-reported error, what the tool returned."""
    partial: tuple[JsonValue, ...] = ()
    """Chunks the call emitted while it ran (progress messages, streamed rows), kept also
    when it then failed or timed out."""
    partial_dropped: int = 0
    """Chunks not kept because the call emitted more than the tracker keeps."""
    error: str | None = None


@dataclass(frozen=True)
class InFlight:
    """A call that has started and not finished."""

    request_id: str
    attempt: int
    tool: str
    probe: bool
    started_at: datetime
    deadline: datetime


class ToolStats(FrozenModel):
    """A tool's counts in this process since start, and its rolling latency."""

    calls: int = 0
    successes: int = 0
    errors: int = 0
    timeouts: int = 0
    rejected: int = 0
    """Calls its open breaker turned away."""
    served_as_fallback: int = 0
    latency: LatencySummary


class _Counters:
    __slots__ = (
        "calls",
        "errors",
        "latency",
        "rejected",
        "served_as_fallback",
        "successes",
        "timeouts",
    )

    def __init__(self, window: int) -> None:
        self.calls = self.successes = self.errors = self.timeouts = 0
        self.rejected = self.served_as_fallback = 0
        self.latency = LatencyWindow(window)


class InvocationTracker:
    """Calls in flight, recent invocations and per-tool statistics of one process."""

    def __init__(
        self,
        *,
        latency_window: int = DEFAULT_LATENCY_WINDOW,
        recent_limit: int = DEFAULT_RECENT_LIMIT,
    ) -> None:
        self._latency_window = latency_window
        self._counters: dict[str, _Counters] = {}
        self._in_flight: dict[tuple[str, int], InFlight] = {}
        self._recent: deque[ToolInvocation] = deque(maxlen=recent_limit)

    def _for(self, tool: str) -> _Counters:
        counters = self._counters.get(tool)
        if counters is None:
            counters = self._counters[tool] = _Counters(self._latency_window)
        return counters

    def started(self, call: InFlight) -> None:
        self._in_flight[(call.request_id, call.attempt)] = call

    def abandoned(self, call: InFlight) -> None:
        """The call was cancelled by its caller: forget it without counting it."""
        self._in_flight.pop((call.request_id, call.attempt), None)

    def finished(self, record: ToolInvocation) -> None:
        self._in_flight.pop((record.request_id, record.attempt), None)
        self._recent.append(record)
        counters = self._for(record.tool)
        counters.calls += 1
        counters.latency.add(record.duration_ms)
        if record.outcome is InvocationOutcome.SUCCESS:
            counters.successes += 1
            if record.attempt > 0:
                counters.served_as_fallback += 1
        elif record.outcome is InvocationOutcome.TIMEOUT:
            counters.timeouts += 1
        else:
            counters.errors += 1

    def rejected(self, tool: str) -> None:
        self._for(tool).rejected += 1

    def stats(self, tool: str) -> ToolStats:
        counters = self._counters.get(tool)
        if counters is None:
            return ToolStats(latency=LatencySummary(samples=0))
        return ToolStats(
            calls=counters.calls,
            successes=counters.successes,
            errors=counters.errors,
            timeouts=counters.timeouts,
            rejected=counters.rejected,
            served_as_fallback=counters.served_as_fallback,
            latency=counters.latency.summary(),
        )

    def in_flight(self) -> list[InFlight]:
        """Running calls, oldest first."""
        return sorted(self._in_flight.values(), key=lambda call: call.started_at)

    def recent(self) -> list[ToolInvocation]:
        """The last finished invocations, oldest first."""
        return list(self._recent)
