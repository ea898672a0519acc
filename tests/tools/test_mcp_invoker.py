"""Tools of a real MCP server, started over stdio through the official SDK: a healthy tool,
a slow one (timeout, partial result), a failing one (breaker opens, fallback answers, the
half-open probe closes it once the tool recovers), error results, crashes, bad servers."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from tiermem.store.backends.memory import MemoryHotStore
from tiermem.testing import FakeClock
from tiermem.tools import (
    BreakerPolicy,
    BreakerStatus,
    SharedBreakers,
    ToolCallError,
    ToolDispatcher,
    ToolRegistry,
    ToolServerError,
    ToolSpec,
    ToolTimeoutError,
)
from tiermem.tools.mcp_invoker import McpStdioInvoker

SERVER = Path(__file__).with_name("mcp_catalog_server.py")
POLICY = BreakerPolicy(
    failure_threshold=2,
    window=timedelta(seconds=60),
    reset_timeout=timedelta(seconds=30),
    probe_lease=timedelta(seconds=20),
)
# Real seconds: the slow tool must really be cut off. Healthy calls take milliseconds.
TIMEOUT = timedelta(seconds=3)


@dataclass
class Catalog:
    state: Path
    clock: FakeClock
    invoker: McpStdioInvoker
    tools: ToolDispatcher

    def set_flaky(self, mode: str) -> None:
        (self.state / "flaky_search").write_text(mode)

    def starts(self) -> list[int]:
        """Process ids of the servers started so far, in order."""
        starts = self.state / "starts"
        return [int(pid) for pid in starts.read_text().split()] if starts.exists() else []

    def quick_lookup(self, timeout: timedelta) -> ToolDispatcher:
        """A dispatcher whose only tool is this server's ``lookup`` with ``timeout``."""
        registry = ToolRegistry()
        registry.register(ToolSpec("lookup", timeout=timeout, breaker=POLICY), self.invoker)
        breakers = SharedBreakers(MemoryHotStore(clock=self.clock), clock=self.clock)
        return ToolDispatcher(registry, breakers, clock=self.clock)

    def flaky_calls(self) -> list[str]:
        calls = self.state / "flaky_search.calls"
        return calls.read_text().splitlines() if calls.exists() else []


@pytest.fixture
async def catalog(tmp_path: Path) -> AsyncIterator[Catalog]:
    (tmp_path / "flaky_search").write_text("down")
    clock = FakeClock()
    with (tmp_path / "server.log").open("w") as errlog:
        async with McpStdioInvoker(
            sys.executable,
            [str(SERVER)],
            env={"TIERMEM_TEST_TOOL_STATE": str(tmp_path)},
            errlog=errlog,
        ) as invoker:
            registry = ToolRegistry()
            specs = await invoker.tool_specs(
                tool_timeout=TIMEOUT,
                breaker=POLICY,
                fallbacks={"flaky_search": ("lookup",), "slow_search": ("lookup",)},
            )
            registry.register_all(specs, invoker)
            registry.register(ToolSpec("missing", timeout=TIMEOUT, breaker=POLICY), invoker)
            breakers = SharedBreakers(MemoryHotStore(clock=clock), clock=clock)
            yield Catalog(tmp_path, clock, invoker, ToolDispatcher(registry, breakers, clock=clock))


async def test_tools_are_discovered_with_their_schemas(catalog: Catalog) -> None:
    lookup = catalog.tools.registry.get("lookup").spec
    assert lookup.description == "Look a title up in the catalog."
    assert lookup.input_schema["properties"] == {"query": {"title": "Query", "type": "string"}}
    assert lookup.input_schema["required"] == ["query"]
    assert catalog.tools.registry.get("flaky_search").spec.fallbacks == ("lookup",)
    names = {spec.name for spec in catalog.tools.registry}
    assert {"lookup", "slow_search", "flaky_search", "partial_search", "crash"} <= names


async def test_healthy_tool_answers(catalog: Catalog) -> None:
    result = await catalog.tools.call("lookup", {"query": "Berserk 42"})
    assert result.text == "found Berserk 42"
    assert result.output.structured == {"result": "found Berserk 42"}
    assert result.output.content == ({"type": "text", "text": "found Berserk 42"},)
    assert not result.degraded
    assert catalog.tools.stats("lookup").latency.samples == 1


async def test_slow_tool_times_out_and_keeps_its_first_hit(catalog: Catalog) -> None:
    with pytest.raises(ToolTimeoutError, match="timed out after 3 s") as info:
        await catalog.tools.call("slow_search", {"query": "Vagabond"})
    assert info.value.partial == (
        {"progress": 1.0, "total": 2.0, "message": "first hit for Vagabond"},
    )
    assert catalog.tools.stats("slow_search").timeouts == 1
    # The cancelled request did not poison the connection.
    assert (await catalog.tools.call("lookup", {"query": "Monster"})).text == "found Monster"
    assert catalog.invoker.connections == 1


async def test_failing_tool_opens_falls_back_and_recovers_through_one_probe(
    catalog: Catalog,
) -> None:
    with pytest.raises(ToolCallError, match="search index is down") as info:
        await catalog.tools.call("flaky_search", {"query": "q1"})
    assert info.value.attempts[0].output is not None  # the error result the server sent

    # The second failure opens the breaker; the same request is answered by the fallback.
    result = await catalog.tools.call("flaky_search", {"query": "q2"})
    assert (result.tool, result.text) == ("lookup", "found q2")
    assert "Tool 'flaky_search' is unavailable since" in (result.agent_note or "")
    assert "Using 'lookup' instead." in (result.agent_note or "")

    # While open, the server is not called at all.
    catalog.clock.advance(10)
    result = await catalog.tools.call("flaky_search", {"query": "q3"})
    assert result.tool == "lookup"
    assert catalog.flaky_calls() == ["q1", "q2"]

    # Retry time, still down: the one probe fails and the breaker re-opens.
    catalog.clock.advance(20)
    result = await catalog.tools.call("flaky_search", {"query": "probe-1"})
    assert result.tool == "lookup"
    assert result.attempts[0].probe
    assert (await catalog.tools.status("flaky_search")).breaker is BreakerStatus.OPEN

    # The backend recovers; the next probe closes the breaker.
    catalog.set_flaky("up")
    catalog.clock.advance(30)
    result = await catalog.tools.call("flaky_search", {"query": "probe-2"})
    assert (result.tool, result.text) == ("flaky_search", "fresh results for probe-2")
    assert result.invocation.probe
    status = await catalog.tools.status("flaky_search")
    assert (status.breaker, status.message) == (BreakerStatus.CLOSED, None)
    assert catalog.flaky_calls() == ["q1", "q2", "probe-1", "probe-2"]
    result = await catalog.tools.call("flaky_search", {"query": "q4"})
    assert result.tool == "flaky_search"
    assert not result.invocation.probe


async def test_error_result_is_raised_with_its_partial_answer(catalog: Catalog) -> None:
    with pytest.raises(ToolCallError) as info:
        await catalog.tools.call("partial_search", {"query": "Akira"})
    assert "shard 2 timed out" in str(info.value)
    assert info.value.partial == (
        {"type": "text", "text": "2 of 9 hits for Akira"},
        {"type": "text", "text": "shard 2 timed out"},
    )


async def test_a_tool_the_server_does_not_have_is_an_error(catalog: Catalog) -> None:
    with pytest.raises(ToolCallError, match="tool 'missing' failed: Unknown tool: missing"):
        await catalog.tools.call("missing", {"query": "x"})


async def test_a_crashed_server_is_restarted_by_the_next_call(catalog: Catalog) -> None:
    with pytest.raises(ToolCallError, match="closed the connection") as info:
        await catalog.tools.call("crash", {"query": "x"})
    assert isinstance(info.value.__cause__, ToolServerError)
    result = await catalog.tools.call("lookup", {"query": "after the crash"})
    assert result.text == "found after the crash"
    assert catalog.invoker.connections == 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_restart_slower_than_the_tool_timeout_is_not_a_timeout(catalog: Catalog) -> None:
    # The restart (spawn, import mcp, a 1 s pause, handshake) happens before the call's
    # 0.3 s timeout starts, within connect_timeout: the tool answers and its breaker stays
    # closed. (It used to run inside the timeout and fail as "timed out after 0.3 s".)
    quick = catalog.quick_lookup(timedelta(milliseconds=300))
    with pytest.raises(ToolCallError, match="closed the connection"):
        await catalog.tools.call("crash", {"query": "x"})
    (catalog.state / "start_delay").write_text("1.0")
    result = await quick.call("lookup", {"query": "after a slow restart"})
    assert result.text == "found after a slow restart"
    assert catalog.invoker.connections == 2
    assert len(catalog.starts()) == 2
    assert quick.stats("lookup").timeouts == 0
    assert (await quick.status("lookup")).recent_failures == 0


async def test_a_caller_cancelled_during_a_restart_leaves_no_server_behind(
    catalog: Catalog,
) -> None:
    patient = catalog.quick_lookup(timedelta(seconds=10))  # only the caller gives up
    with pytest.raises(ToolCallError, match="closed the connection"):
        await catalog.tools.call("crash", {"query": "x"})
    (catalog.state / "start_delay").write_text("60")  # never serves within the test
    call = asyncio.create_task(patient.call("lookup", {"query": "given up"}))
    for _ in range(400):  # the restarted server has begun (a bounded wait for a subprocess)
        if len(catalog.starts()) == 2 or call.done():
            break
        await asyncio.sleep(0.05)
    assert len(catalog.starts()) == 2, f"no restart began; the call: {call}"
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert patient.in_flight() == []
    pid = catalog.starts()[1]
    for _ in range(400):  # the SDK closes stdin, waits 2 s, then terminates the process
        if not _alive(pid):
            break
        await asyncio.sleep(0.05)
    assert not _alive(pid), "the half-started server is still running"
    # The next call starts a fresh server.
    (catalog.state / "start_delay").unlink()
    assert (await patient.call("lookup", {"query": "again"})).text == "found again"
    assert len(catalog.starts()) == 3


async def test_a_server_that_cannot_start_is_a_server_error(tmp_path: Path) -> None:
    script = tmp_path / "broken_server.py"
    script.write_text("import sys\nsys.exit(2)\n")
    with (tmp_path / "server.log").open("w") as errlog:
        invoker = McpStdioInvoker(
            sys.executable, [str(script)], errlog=errlog, connect_timeout=timedelta(seconds=10)
        )
        with pytest.raises(ToolServerError, match=r"could not be started|did not start"):
            await invoker.connect()
        await invoker.aclose()
