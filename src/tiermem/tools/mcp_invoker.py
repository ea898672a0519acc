"""Tools of a real MCP server, through the official ``mcp`` client SDK (the ``mcp`` extra).

:class:`McpStdioInvoker` starts the server as a subprocess and speaks MCP over its stdin and
stdout (``mcp.client.stdio.stdio_client`` + ``mcp.ClientSession``)::

    async with McpStdioInvoker(sys.executable, ["catalog_server.py"]) as catalog:
        for spec in await catalog.tool_specs(fallbacks={"search": ("cached_search",)}):
            registry.register(spec, catalog)
        ...

How results map:

* a ``CallToolResult`` becomes a :class:`~tiermem.tools.invoker.ToolOutput`: content blocks
  as JSON, ``structured_content``, and ``is_error`` when the tool reported a failure (the
  dispatcher raises it; it never reads as an empty answer);
* progress notifications the tool sends while it works are partial chunks
  (``{"progress": 1, "total": 3, "message": "..."}``), kept when the call then fails or
  times out;
* a protocol error or a lost connection raises :class:`~tiermem.tools.errors.ToolServerError`.
  After a lost connection (the server crashed) the next call starts the server again, so a
  breaker's recovery probe finds a restarted server. Through the dispatcher that restart
  happens in :meth:`McpStdioInvoker.prepare`, bounded by ``connect_timeout`` and before the
  tool's timeout starts.

The SDK's connection lives in anyio task groups that must be entered and left by the same
task, so one owner task holds it for the invoker's lifetime; calls from any task use it.
Timeouts are the dispatcher's (a cancelled call sends MCP's cancellation notification).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Self, TextIO

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, PaginatedRequestParams

from tiermem.models import JsonValue
from tiermem.tools.breaker import BreakerPolicy
from tiermem.tools.errors import ToolServerError
from tiermem.tools.invoker import PartialSink, ToolOutput
from tiermem.tools.registry import DEFAULT_TIMEOUT, ToolSpec

__all__ = ["McpStdioInvoker"]

logger = logging.getLogger(__name__)

_CLOSE_GRACE_S = 5.0
"""How long closing waits for the owner task before cancelling it."""


class McpStdioInvoker:
    """The tools of one MCP server started as ``command args...`` over stdio.

    ``env`` is added to the SDK's safe default environment; ``errlog`` receives the
    server's stderr (default: this process's stderr). ``connect_timeout`` bounds starting
    the server and the MCP handshake.
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        name: str | None = None,
        connect_timeout: timedelta = timedelta(seconds=10),
        errlog: TextIO | None = None,
    ) -> None:
        self._params = StdioServerParameters(
            command=command, args=list(args), env=dict(env) if env else None, cwd=cwd
        )
        self.name = name or " ".join([command, *args])
        self._connect_timeout = connect_timeout
        self._errlog = errlog or sys.stderr
        self._session: ClientSession | None = None
        self._stop: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[ClientSession] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        """Owners of connections a cancelled caller abandoned, until they have stopped."""
        self._lock = asyncio.Lock()
        self.connections = 0
        """How often the server was started (1 plus restarts after lost connections)."""

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Start the server and initialize the session, unless already connected.

        Raises:
            ToolServerError: the server did not start or answer the handshake in time.
        """
        await self._live_session()

    async def prepare(self, tool: str) -> None:
        """(Re)start the server if it is not connected, within ``connect_timeout``: the
        dispatcher calls this before a call's timeout starts
        (:class:`~tiermem.tools.invoker.PreparingInvoker`), so a restart after a crash is not
        counted as the tool timing out. Cancelling it stops a half-started server.

        Raises:
            ToolServerError: the server did not start or answer the handshake in time.
        """
        await self._live_session()

    async def _live_session(self) -> ClientSession:
        async with self._lock:
            if self._session is not None and self._owner is not None and not self._owner.done():
                return self._session
            await self._retire()
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[ClientSession] = loop.create_future()
            stop = asyncio.Event()
            self._stop = stop
            self._ready = ready
            self._owner = asyncio.create_task(self._own(ready, stop), name=f"mcp:{self.name}")
            try:
                async with asyncio.timeout(self._connect_timeout.total_seconds()):
                    session = await asyncio.shield(ready)
            except asyncio.CancelledError:
                # The caller gave up: stop the half-started server now rather than leave it
                # to the next call. Not awaited, so the cancellation is not delayed by the
                # server's shutdown; aclose() waits for it.
                self._abandon()
                raise
            except TimeoutError as exc:
                await self._retire()
                raise ToolServerError(
                    f"MCP server {self.name!r} did not start and answer the handshake within "
                    f"{self._connect_timeout.total_seconds():g} s; check the command, or raise "
                    "connect_timeout",
                    server=self.name,
                ) from exc
            except Exception as exc:
                await self._retire()
                raise ToolServerError(
                    f"MCP server {self.name!r} could not be started: {type(exc).__name__}: {exc}",
                    server=self.name,
                ) from exc
            self._session = session
            self.connections += 1
            return session

    async def _own(self, ready: asyncio.Future[ClientSession], stop: asyncio.Event) -> None:
        """Hold the connection: enter the SDK's contexts, publish the session, wait, leave."""
        try:
            async with (
                stdio_client(self._params, errlog=self._errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                ready.set_result(session)
                await stop.wait()
        except Exception as exc:  # noqa: BLE001 -- reported to the starter, or logged on shutdown
            if not ready.done():
                ready.set_exception(exc)
            else:
                logger.warning("MCP server %s: connection closed with %r", self.name, exc)
        finally:
            if not ready.done():
                ready.cancel()

    async def _retire(self) -> None:
        """Close the current connection (if any) and wait for its owner task to end."""
        self._session = None
        owner, stop, ready = self._owner, self._stop, self._ready
        self._owner = self._stop = self._ready = None
        if stop is not None:
            stop.set()
        if owner is None:
            return
        # A graceful close stops the server (the SDK waits up to 2 s, then kills it); an owner
        # still in the handshake is not waiting for ``stop`` and is cancelled at once (the
        # SDK's shielded shutdown still stops the process).
        if ready is not None and ready.done():
            done, _ = await asyncio.wait({owner}, timeout=_CLOSE_GRACE_S)
            if done:
                return
        owner.cancel()
        await asyncio.wait({owner})

    def _abandon(self) -> None:
        """Cancel a connection still being made, without waiting (see ``_closing``)."""
        owner = self._owner
        self._session = None
        self._owner = self._stop = self._ready = None
        if owner is not None and not owner.done():
            owner.cancel()
            self._closing.add(owner)
            owner.add_done_callback(self._closing.discard)

    async def _drop(self, session: ClientSession) -> None:
        """Forget a session whose connection was lost; the next call restarts the server."""
        async with self._lock:
            if self._session is session:
                logger.warning("MCP server %s: connection lost; restarting on next call", self.name)
                await self._retire()

    async def aclose(self) -> None:
        """Stop the server (and any start a cancelled call left behind). Safe to call twice."""
        async with self._lock:
            await self._retire()
            if self._closing:
                await asyncio.wait(set(self._closing))

    async def tool_specs(
        self,
        *,
        tool_timeout: timedelta = DEFAULT_TIMEOUT,
        breaker: BreakerPolicy | None = None,
        fallbacks: Mapping[str, Sequence[str]] | None = None,
    ) -> list[ToolSpec]:
        """The server's tools as specs (name, description, input schema), with
        ``tool_timeout``, ``breaker`` and each tool's ``fallbacks`` applied.

        Raises:
            ToolServerError: the server cannot be reached.
            ValidationError: a tool whose name or schema tiermem cannot accept.
        """
        session = await self._live_session()
        fallbacks = fallbacks or {}
        specs: list[ToolSpec] = []
        cursor: str | None = None
        while True:
            params = None if cursor is None else PaginatedRequestParams(cursor=cursor)
            try:
                listing = await session.list_tools(params=params)
            except MCPError as exc:
                raise await self._server_error(session, exc, "") from exc
            for tool in listing.tools:
                specs.append(
                    ToolSpec(
                        name=tool.name,
                        description=tool.description or "",
                        input_schema=tool.input_schema,
                        fallbacks=tuple(fallbacks.get(tool.name, ())),
                        timeout=tool_timeout,
                        breaker=breaker,
                    )
                )
            cursor = listing.next_cursor
            if cursor is None:
                return specs

    async def invoke(
        self,
        tool: str,
        arguments: Mapping[str, JsonValue],
        *,
        request_id: str,
        emit: PartialSink,
    ) -> ToolOutput:
        """Call ``tool`` on the server (see the module docstring for the mapping).

        Raises:
            ToolServerError: the server cannot be reached, the connection was lost, or it
                answered with a protocol error (unknown tool, invalid arguments).
        """
        session = await self._live_session()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            chunk: dict[str, JsonValue] = {"progress": progress}
            if total is not None:
                chunk["total"] = total
            if message is not None:
                chunk["message"] = message
            emit(chunk)

        try:
            result = await session.call_tool(tool, dict(arguments), progress_callback=on_progress)
        except MCPError as exc:
            raise await self._server_error(session, exc, tool) from exc
        return ToolOutput(
            content=tuple(
                block.model_dump(mode="json", exclude_none=True) for block in result.content
            ),
            structured=result.structured_content,
            is_error=bool(result.is_error),
        )

    async def _server_error(
        self, session: ClientSession, exc: MCPError, tool: str
    ) -> ToolServerError:
        doing = f"calling {tool!r}" if tool else "listing tools"
        if exc.code == CONNECTION_CLOSED:
            await self._drop(session)
            message = (
                f"MCP server {self.name!r} closed the connection while {doing} (did it crash? "
                "see its stderr); the next call restarts it"
            )
        else:
            message = (
                f"MCP server {self.name!r} answered {doing} with error {exc.code}: {exc.message}"
            )
        return ToolServerError(message, server=self.name, tool=tool)
