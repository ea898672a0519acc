"""What a tool call returns, and the small protocol every way of calling a tool implements.

An invoker runs one call. It returns a :class:`ToolOutput` (``is_error`` when the tool
itself reported a failure, with whatever content it produced: a partial result), may hand
partial chunks to ``emit`` while it works (progress messages, streamed rows), and raises
any exception when the call could not be made at all (a dead server, a broken pipe). The
dispatcher enforces the timeout, keeps the chunks, and counts failures against the
tool's breaker; an invoker does none of that.

An invoker that must connect to something before it can call (start a server, open a
session) may also implement :class:`PreparingInvoker`: the dispatcher then awaits
``prepare(tool)`` before each call, outside the call's timeout, because the tool's timeout
bounds the tool's answer, not its server's start-up. ``prepare`` bounds its own wait (e.g.
a connect timeout) and raises what prevented the connection; that failure is the call's
failure, counted by the tool's breaker like any other. An invoker without ``prepare``
(:class:`FunctionInvoker`, most hand-written ones) is called directly.

:class:`FunctionInvoker` serves tools written as Python functions (fallbacks such as a
cache lookup); :class:`~tiermem.tools.mcp_invoker.McpStdioInvoker` serves the tools of an
MCP server.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, runtime_checkable

from tiermem.errors import NotFoundError
from tiermem.models import FrozenModel, JsonValue

__all__ = [
    "FunctionInvoker",
    "PartialSink",
    "PreparingInvoker",
    "ToolFunction",
    "ToolInvoker",
    "ToolOutput",
]

PartialSink = Callable[[JsonValue], None]
"""Receives one partial chunk of a call in progress; chunks are kept even if the call then
fails or times out."""


class ToolOutput(FrozenModel):
    """A tool's answer: MCP-style content blocks and optional structured content."""

    content: tuple[dict[str, JsonValue], ...] = ()
    """Content blocks, e.g. ``{"type": "text", "text": "..."}``."""
    structured: dict[str, JsonValue] | None = None
    is_error: bool = False
    """The tool ran and reported a failure; ``content`` holds what it said (and any partial
    result it returned)."""

    @classmethod
    def of_text(cls, text: str, *, is_error: bool = False) -> ToolOutput:
        return cls(content=({"type": "text", "text": text},), is_error=is_error)

    @property
    def text(self) -> str:
        """The text blocks joined by newlines ("" if there are none)."""
        return "\n".join(
            block["text"]
            for block in self.content
            if block.get("type") == "text" and isinstance(block.get("text"), str)
        )


class ToolInvoker(Protocol):
    """Runs calls of one or more tools (see the module docstring for the rules)."""

    async def invoke(
        self,
        tool: str,
        arguments: Mapping[str, JsonValue],
        *,
        request_id: str,
        emit: PartialSink,
    ) -> ToolOutput:
        """Call ``tool`` once. Raises whatever prevented the call from being made."""
        ...


@runtime_checkable
class PreparingInvoker(ToolInvoker, Protocol):
    """An invoker with a connection step the dispatcher runs before the call's timeout."""

    async def prepare(self, tool: str) -> None:
        """Make ``tool`` callable now (start or restart its server), returning at once when
        it already is. Bounded by the invoker's own limit, not the tool's timeout.

        Raises whatever prevented the connection (the call then fails with it as cause).
        """
        ...


ToolFunction = Callable[[Mapping[str, JsonValue], PartialSink], Awaitable[object]]
"""An async function serving a tool: ``(arguments, emit) -> result``. A result that is a
:class:`ToolOutput` is used as is; a string becomes one text block; anything else JSON
becomes structured content with its JSON as text."""


class FunctionInvoker:
    """Tools served by async Python functions, by name."""

    def __init__(self, functions: Mapping[str, ToolFunction]) -> None:
        self._functions = dict(functions)

    async def invoke(
        self,
        tool: str,
        arguments: Mapping[str, JsonValue],
        *,
        request_id: str,
        emit: PartialSink,
    ) -> ToolOutput:
        """Raises:
        NotFoundError: no function serves ``tool``.
        """
        function = self._functions.get(tool)
        if function is None:
            raise NotFoundError(
                f"FunctionInvoker has no function for tool {tool!r}; "
                f"it serves {sorted(self._functions)}"
            )
        result = await function(arguments, emit)
        if isinstance(result, ToolOutput):
            return result
        if isinstance(result, str):
            return ToolOutput.of_text(result)
        text = json.dumps(result, ensure_ascii=False)
        structured = result if isinstance(result, dict) else {"result": result}
        return ToolOutput(content=({"type": "text", "text": text},), structured=structured)
