"""An invoker that connects before calling (PreparingInvoker): the dispatcher runs its
``prepare`` step outside the tool's timeout, counts its failure as the call's failure, and
still calls invokers without the step directly."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from datetime import timedelta

import pytest

from tests.tools.support import ScriptedInvoker, until
from tiermem.models import JsonValue
from tiermem.store.backends.memory import MemoryHotStore
from tiermem.testing import FakeClock
from tiermem.tools import (
    BreakerPolicy,
    BreakerStatus,
    InvocationOutcome,
    PartialSink,
    SharedBreakers,
    ToolCallError,
    ToolDispatcher,
    ToolOutput,
    ToolRegistry,
    ToolServerError,
    ToolSpec,
    ToolTimeoutError,
)
from tiermem.tools.invoker import PreparingInvoker

POLICY = BreakerPolicy(
    failure_threshold=2,
    window=timedelta(seconds=60),
    reset_timeout=timedelta(seconds=30),
    probe_lease=timedelta(seconds=10),
)
TIMEOUT = timedelta(milliseconds=50)
SLOW_CONNECT_S = 0.25
"""Real seconds: longer than TIMEOUT, so a connection made inside the timeout fails."""


class ConnectingInvoker:
    """Connects on first use, like an MCP server that must be (re)started.

    ``connect_s`` is how long connecting takes (real seconds; the dispatcher's timeout is
    real), ``fail_connect`` raises instead, ``advance`` moves the fake clock while
    connecting. ``invoke`` connects itself when nobody prepared it, as a protocol-only
    caller would need.
    """

    def __init__(self, clock: FakeClock, *, connect_s: float = SLOW_CONNECT_S) -> None:
        self.clock = clock
        self.connect_s = connect_s
        self.connected = False
        self.fail_connect: Exception | None = None
        self.advance = 0.0
        self.calls: Counter[str] = Counter()
        self.gate: asyncio.Event | None = None

    async def _connect(self) -> None:
        if self.connected:
            return
        await asyncio.sleep(self.connect_s)
        self.clock.advance(self.advance)
        if self.fail_connect is not None:
            raise self.fail_connect
        self.connected = True

    async def prepare(self, tool: str) -> None:
        await self._connect()

    async def invoke(
        self,
        tool: str,
        arguments: Mapping[str, JsonValue],
        *,
        request_id: str,
        emit: PartialSink,
    ) -> ToolOutput:
        await self._connect()
        self.calls[tool] += 1
        if self.gate is not None:
            await self.gate.wait()
        return ToolOutput.of_text(f"{tool} answered")


def _dispatcher(clock: FakeClock, connecting: ConnectingInvoker) -> ToolDispatcher:
    registry = ToolRegistry()
    registry.register(ToolSpec("cached_search", timeout=TIMEOUT), ScriptedInvoker())
    registry.register(
        ToolSpec("search", timeout=TIMEOUT, breaker=POLICY, fallbacks=("cached_search",)),
        connecting,
    )
    breakers = SharedBreakers(MemoryHotStore(clock=clock), clock=clock)
    return ToolDispatcher(registry, breakers, clock=clock)


def test_the_protocol_is_recognised_by_its_prepare_method() -> None:
    assert isinstance(ConnectingInvoker(FakeClock()), PreparingInvoker)
    assert not isinstance(ScriptedInvoker(), PreparingInvoker)


async def test_a_connection_slower_than_the_timeout_does_not_time_the_tool_out() -> None:
    # Connecting takes 250 ms, the tool's timeout is 50 ms: the timeout starts after it.
    # (Before: the connection ran inside the timeout and the call failed as a timeout.)
    clock = FakeClock()
    connecting = ConnectingInvoker(clock)
    tools = _dispatcher(clock, connecting)
    result = await tools.call("search", {"q": "Berserk"})
    assert (result.tool, result.text) == ("search", "search answered")
    assert result.invocation.outcome is InvocationOutcome.SUCCESS
    assert result.invocation.duration_ms >= SLOW_CONNECT_S * 1000  # the caller did wait
    assert tools.stats("search").timeouts == 0


async def test_the_answer_deadline_in_flight_starts_after_the_connection() -> None:
    clock = FakeClock()
    connecting = ConnectingInvoker(clock, connect_s=0)
    connecting.advance = 7
    connecting.gate = asyncio.Event()
    tools = _dispatcher(clock, connecting)
    started = clock.now()
    call = asyncio.create_task(tools.call("search", {"q": "x"}))
    await until(lambda: connecting.calls["search"] == 1)
    (in_flight,) = tools.in_flight()
    assert in_flight.started_at == started
    assert in_flight.deadline == started + timedelta(seconds=7) + TIMEOUT
    connecting.gate.set()
    assert (await call).text == "search answered"
    assert tools.in_flight() == []


async def test_a_failed_connection_is_the_call_failure_and_counts_against_the_breaker() -> None:
    clock = FakeClock()
    connecting = ConnectingInvoker(clock, connect_s=0)
    connecting.fail_connect = ToolServerError("server did not start", server="catalog")
    tools = _dispatcher(clock, connecting)
    with pytest.raises(ToolCallError, match="server did not start") as info:
        await tools.call("search", {"q": "1"})
    assert not isinstance(info.value, ToolTimeoutError)
    assert isinstance(info.value.__cause__, ToolServerError)
    assert info.value.attempts[0].outcome is InvocationOutcome.ERROR
    # The second failure opens the breaker and the fallback answers.
    result = await tools.call("search", {"q": "2"})
    assert result.tool == "cached_search"
    assert (await tools.status("search")).breaker is BreakerStatus.OPEN
    assert connecting.calls["search"] == 0


async def test_a_timeout_raised_while_connecting_is_an_error_not_the_tool_timeout() -> None:
    clock = FakeClock()
    connecting = ConnectingInvoker(clock, connect_s=0)
    connecting.fail_connect = TimeoutError("handshake took too long")
    tools = _dispatcher(clock, connecting)
    with pytest.raises(ToolCallError) as info:
        await tools.call("search", {"q": "1"})
    assert not isinstance(info.value, ToolTimeoutError)
    assert "TimeoutError: handshake took too long" in str(info.value)
    assert tools.stats("search").errors == 1
    assert tools.stats("search").timeouts == 0


async def test_a_caller_cancelled_while_connecting_leaves_nothing_in_flight() -> None:
    clock = FakeClock()
    connecting = ConnectingInvoker(clock, connect_s=30)
    tools = _dispatcher(clock, connecting)
    call = asyncio.create_task(tools.call("search", {"q": "x"}))
    await until(lambda: bool(tools.in_flight()))
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert tools.in_flight() == []
    assert tools.stats("search").calls == 0
