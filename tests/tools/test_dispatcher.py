"""Calling tools through the dispatcher: results, errors with partial results, timeouts,
fallbacks when a breaker opens, the half-open probe, tracking and status."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import pytest

from tests.tools.support import CountingStore, ScriptedInvoker, until
from tiermem.errors import NotFoundError
from tiermem.store.backends.memory import MemoryHotStore
from tiermem.testing import FakeClock
from tiermem.tools import (
    BreakerPolicy,
    BreakerStatus,
    InvocationOutcome,
    SharedBreakers,
    ToolCallError,
    ToolDispatcher,
    ToolHealth,
    ToolRegistry,
    ToolSpec,
    ToolTimeoutError,
    ToolUnavailableError,
)

POLICY = BreakerPolicy(
    failure_threshold=2,
    window=timedelta(seconds=60),
    reset_timeout=timedelta(seconds=30),
    probe_lease=timedelta(seconds=10),
)
TIMEOUT = timedelta(milliseconds=50)


class Ticks:
    """A monotonic clock that moves 5 ms per reading: durations are 5 ms per call."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.005
        return self.now


@dataclass
class World:
    clock: FakeClock
    store: CountingStore
    invoker: ScriptedInvoker
    tools: ToolDispatcher

    async def open_search(self) -> None:
        self.invoker.behaviour["search"] = "raise"
        with pytest.raises(ToolCallError):
            await self.tools.call("search", {"q": "x"})
        result = await self.tools.call("search", {"q": "x"})
        assert result.tool == "cached_search"


@pytest.fixture
async def world() -> AsyncIterator[World]:
    clock = FakeClock()
    hot = MemoryHotStore(clock=clock)
    store = CountingStore(hot, interleave=True)
    invoker = ScriptedInvoker()
    registry = ToolRegistry()
    registry.register(ToolSpec("cached_search", "yesterday's snapshot", timeout=TIMEOUT), invoker)
    registry.register(
        ToolSpec(
            "search",
            "Search the catalog",
            {"type": "object", "properties": {"q": {"type": "string"}}},
            fallbacks=("cached_search",),
            timeout=TIMEOUT,
            breaker=POLICY,
        ),
        invoker,
    )
    registry.register(ToolSpec("orders", "Order lookup", timeout=TIMEOUT, breaker=POLICY), invoker)
    breakers = SharedBreakers(store, clock=clock)
    tools = ToolDispatcher(registry, breakers, clock=clock, monotonic=Ticks())
    yield World(clock, store, invoker, tools)
    await hot.aclose()


async def test_healthy_call_returns_the_answer_with_one_read(world: World) -> None:
    result = await world.tools.call("search", {"q": "Berserk"}, request_id="req-1")
    assert result.text == "search: {'q': 'Berserk'}"
    assert (result.tool, result.requested_tool, result.degraded) == ("search", "search", False)
    assert result.agent_note is None
    record = result.invocation
    assert (record.request_id, record.attempt, record.outcome) == (
        "req-1",
        0,
        InvocationOutcome.SUCCESS,
    )
    assert record.duration_ms == 5.0
    assert record.started_at == world.clock.now()
    assert world.store.calls == {"get_shared": 1}


async def test_request_ids_are_generated_when_not_given(world: World) -> None:
    first = await world.tools.call("search", {"q": "a"})
    second = await world.tools.call("search", {"q": "b"})
    assert first.invocation.request_id != second.invocation.request_id


async def test_a_tool_reported_error_is_raised_with_its_partial_result(world: World) -> None:
    world.invoker.behaviour["search"] = "error"
    with pytest.raises(ToolCallError) as info:
        await world.tools.call("search", {"q": "x"})
    error = info.value
    assert type(error) is ToolCallError
    assert "index shard 3 is down" in str(error)
    assert "fallbacks: cached_search" in str(error)
    assert error.partial == (
        {"row": 1},
        {"type": "text", "text": "rows 1-10 of 50"},
        {"type": "text", "text": "index shard 3 is down"},
    )
    assert error.attempts[0].outcome is InvocationOutcome.ERROR
    # One failure of two: the breaker still trusts the tool, so no fallback was called.
    assert world.invoker.calls["cached_search"] == 0
    status = await world.tools.status("search")
    assert status.health is ToolHealth.DEGRADED
    assert status.recent_failures == 1


async def test_a_call_that_cannot_be_made_is_raised_from_its_cause(world: World) -> None:
    world.invoker.behaviour["search"] = "raise"
    with pytest.raises(ToolCallError, match="ConnectionResetError") as info:
        await world.tools.call("search", {"q": "x"})
    assert isinstance(info.value.__cause__, ConnectionResetError)


async def test_timeout_cancels_the_call_and_keeps_its_chunks(world: World) -> None:
    world.invoker.behaviour["search"] = "hang"
    with pytest.raises(ToolTimeoutError, match=r"timed out after 0\.05 s") as info:
        await world.tools.call("search", {"q": "x"})
    assert info.value.partial == ("first chunk",)
    assert info.value.attempts[0].outcome is InvocationOutcome.TIMEOUT
    assert world.tools.stats("search").timeouts == 1
    assert world.tools.in_flight() == []


async def test_the_failure_that_opens_the_breaker_falls_back(world: World) -> None:
    world.invoker.behaviour["search"] = "raise"
    with pytest.raises(ToolCallError):
        await world.tools.call("search", {"q": "x"})
    result = await world.tools.call("search", {"q": "x"})
    assert (result.tool, result.degraded) == ("cached_search", True)
    assert [a.tool for a in result.attempts] == ["search", "cached_search"]
    assert result.attempts[0].outcome is InvocationOutcome.ERROR
    (degradation,) = result.degradations
    assert degradation.tool == "search"
    assert degradation.fallback == "cached_search"
    assert result.agent_note == (
        "Tool 'search' is unavailable since 00:00:00 UTC (0 s ago) after repeated failures "
        "(last error: ConnectionResetError: connection reset by peer); it will be retried at "
        "00:00:30 UTC (in 30 s). Using 'cached_search' instead."
    )


async def test_open_breaker_skips_the_tool_without_calling_it(world: World) -> None:
    await world.open_search()
    calls = world.invoker.calls["search"]
    world.clock.advance(10)
    result = await world.tools.call("search", {"q": "y"})
    assert result.tool == "cached_search"
    assert world.invoker.calls["search"] == calls
    assert [a.tool for a in result.attempts] == ["cached_search"]
    assert result.invocation.attempt == 1
    assert "in 20 s" in (result.agent_note or "")
    stats = world.tools.stats("search")
    assert stats.rejected == 1
    assert world.tools.stats("cached_search").served_as_fallback == 2


async def test_the_probe_closes_the_breaker_once_the_tool_recovers(world: World) -> None:
    await world.open_search()
    world.clock.advance(30)
    world.invoker.behaviour["search"] = "error"
    result = await world.tools.call("search", {"q": "probe 1"})
    assert result.tool == "cached_search"
    assert result.attempts[0].probe is True
    assert (await world.tools.status("search")).breaker is BreakerStatus.OPEN
    world.clock.advance(30)
    world.invoker.behaviour["search"] = "ok"
    result = await world.tools.call("search", {"q": "probe 2"})
    assert (result.tool, result.invocation.probe) == ("search", True)
    status = await world.tools.status("search")
    assert (status.health, status.breaker, status.message) == (
        ToolHealth.HEALTHY,
        BreakerStatus.CLOSED,
        None,
    )


async def test_only_one_caller_probes_the_others_use_the_fallback(world: World) -> None:
    await world.open_search()
    world.clock.advance(30)
    world.invoker.behaviour["search"] = "ok"
    gate = asyncio.Event()
    world.invoker.gates["search"] = gate
    before = world.invoker.calls["search"]
    calls = [asyncio.create_task(world.tools.call("search", {"q": i})) for i in range(10)]
    # Nine callers are rejected and answered by the fallback while the probe waits.
    await until(lambda: world.invoker.calls["search"] - before == 1)
    await until(lambda: sum(t.done() for t in calls) == 9)
    gate.set()
    results = await asyncio.gather(*calls)
    assert world.invoker.calls["search"] - before == 1
    assert sorted(r.tool for r in results) == ["cached_search"] * 9 + ["search"]
    waiting = [r for r in results if r.tool == "cached_search"]
    assert all("a recovery check is in progress" in (r.agent_note or "") for r in waiting)


async def test_no_tool_left_raises_unavailable_with_the_reasons(world: World) -> None:
    world.invoker.behaviour["orders"] = "raise"
    with pytest.raises(ToolCallError):
        await world.tools.call("orders")
    with pytest.raises(ToolUnavailableError) as info:
        await world.tools.call("orders")
    assert str(info.value).endswith("No fallback is available.")
    with pytest.raises(ToolUnavailableError, match="Tool 'orders' is unavailable since") as info:
        await world.tools.call("orders")
    assert info.value.attempts == ()
    assert world.invoker.calls["orders"] == 2


async def test_a_failing_fallback_is_reported_with_the_primary_degradation(world: World) -> None:
    await world.open_search()
    world.invoker.behaviour["cached_search"] = "error"
    with pytest.raises(ToolCallError, match="'cached_search' \\(fallback of 'search'\\)") as info:
        await world.tools.call("search", {"q": "z"})
    (degradation,) = info.value.degradations
    assert (degradation.tool, degradation.fallback) == ("search", "cached_search")


async def test_in_flight_calls_are_listed_until_they_end(world: World) -> None:
    gate = asyncio.Event()
    world.invoker.gates["search"] = gate
    task = asyncio.create_task(world.tools.call("search", {"q": "x"}, request_id="r-7"))
    await until(lambda: world.invoker.calls["search"] == 1)
    (running,) = world.tools.in_flight()
    assert (running.request_id, running.tool, running.probe) == ("r-7", "search", False)
    assert running.deadline == running.started_at + TIMEOUT
    gate.set()
    await task
    assert world.tools.in_flight() == []


async def test_a_cancelled_call_is_not_counted_against_the_tool(world: World) -> None:
    world.invoker.gates["search"] = asyncio.Event()
    task = asyncio.create_task(world.tools.call("search", {"q": "x"}))
    await until(lambda: world.invoker.calls["search"] == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert world.tools.in_flight() == []
    assert world.tools.stats("search").calls == 0
    assert (await world.tools.status("search")).recent_failures == 0


async def test_partial_chunks_are_bounded(world: World) -> None:
    async def chatty(arguments: object, emit: object) -> str:
        for i in range(10):
            emit(i)  # type: ignore[operator]
        raise RuntimeError("gave up")

    from tiermem.tools import FunctionInvoker

    registry = ToolRegistry()
    registry.register(ToolSpec("chatty", timeout=TIMEOUT), FunctionInvoker({"chatty": chatty}))
    tools = ToolDispatcher(registry, world.tools.breakers, clock=world.clock, max_partial_chunks=3)
    with pytest.raises(ToolCallError) as info:
        await tools.call("chatty")
    assert info.value.partial == (0, 1, 2)
    assert info.value.attempts[0].partial_dropped == 7


async def test_statistics_and_latency_percentiles(world: World) -> None:
    for _ in range(20):
        await world.tools.call("search", {"q": "x"})
    world.invoker.behaviour["search"] = "error"
    with pytest.raises(ToolCallError):
        await world.tools.call("search", {"q": "x"})
    stats = world.tools.stats("search")
    assert (stats.calls, stats.successes, stats.errors, stats.timeouts) == (21, 20, 1, 0)
    assert stats.latency.samples == 21
    assert stats.latency.p50_ms == stats.latency.p99_ms == 5.0
    assert len(world.tools.recent()) == 21


async def test_status_and_agent_notes(world: World) -> None:
    assert await world.tools.agent_notes() == []
    await world.open_search()
    notes = await world.tools.agent_notes()
    assert len(notes) == 1
    assert notes[0].startswith("Tool 'search' is unavailable since")
    assert "Using 'cached_search' instead." in notes[0]
    status = await world.tools.status("search")
    assert status.health is ToolHealth.UNAVAILABLE
    assert status.since == world.clock.now()
    assert status.retry_at == world.clock.now() + POLICY.reset_timeout
    assert [s.name for s in await world.tools.statuses()] == ["cached_search", "search", "orders"]


async def test_unknown_tool_is_not_found(world: World) -> None:
    with pytest.raises(NotFoundError, match="no tool named 'nope'"):
        await world.tools.call("nope")


async def test_a_bad_request_id_is_rejected_before_any_call(world: World) -> None:
    from tiermem.errors import ValidationError

    with pytest.raises(ValidationError, match="request_id"):
        await world.tools.call("search", {"q": "x"}, request_id="two\nlines")
    assert world.invoker.calls["search"] == 0
