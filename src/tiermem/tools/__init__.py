"""Tool state: a registry of tools, circuit breakers shared by every worker, invocation
tracking, fallbacks and degradation messages (seed 000 §4).

::

    registry = ToolRegistry()
    registry.register(ToolSpec("cached_search", "Search yesterday's catalog snapshot"), local)
    registry.register(
        ToolSpec("search", "Search the catalog", input_schema, fallbacks=("cached_search",)),
        mcp_invoker,
    )
    tools = ToolDispatcher(registry, SharedBreakers(hot_store, clock=clock), clock=clock)
    result = await tools.call("search", {"query": "Berserk"})
    result.text, result.tool, result.agent_note   # agent_note: why a fallback answered

Modules: :mod:`~tiermem.tools.breaker` (the pure state machine),
:mod:`~tiermem.tools.breaker_store` (breakers in the hot store's shared keyspace),
:mod:`~tiermem.tools.registry`, :mod:`~tiermem.tools.dispatcher`,
:mod:`~tiermem.tools.invocation` (records, statistics), :mod:`~tiermem.tools.latency`,
:mod:`~tiermem.tools.degradation`, :mod:`~tiermem.tools.errors`, and
:mod:`~tiermem.tools.mcp_invoker` (the ``mcp`` extra: tools of an MCP server over stdio; not
imported here).
"""

from tiermem.tools.breaker import (
    Admission,
    BreakerPolicy,
    BreakerState,
    BreakerStatus,
    ToolHealth,
)
from tiermem.tools.breaker_store import Permit, SharedBreakers
from tiermem.tools.degradation import Degradation
from tiermem.tools.dispatcher import ToolDispatcher, ToolResult, ToolStatus
from tiermem.tools.errors import (
    ToolCallError,
    ToolError,
    ToolServerError,
    ToolTimeoutError,
    ToolUnavailableError,
)
from tiermem.tools.invocation import InFlight, InvocationOutcome, ToolInvocation, ToolStats
from tiermem.tools.invoker import (
    FunctionInvoker,
    PartialSink,
    PreparingInvoker,
    ToolInvoker,
    ToolOutput,
)
from tiermem.tools.latency import LatencySummary
from tiermem.tools.registry import RegisteredTool, ToolRegistry, ToolSpec

__all__ = [
    "Admission",
    "BreakerPolicy",
    "BreakerState",
    "BreakerStatus",
    "Degradation",
    "FunctionInvoker",
    "InFlight",
    "InvocationOutcome",
    "LatencySummary",
    "PartialSink",
    "Permit",
    "PreparingInvoker",
    "RegisteredTool",
    "SharedBreakers",
    "ToolCallError",
    "ToolDispatcher",
    "ToolError",
    "ToolHealth",
    "ToolInvocation",
    "ToolInvoker",
    "ToolOutput",
    "ToolRegistry",
    "ToolResult",
    "ToolServerError",
    "ToolSpec",
    "ToolStats",
    "ToolStatus",
    "ToolTimeoutError",
    "ToolUnavailableError",
]
