"""The MCP server: tiermem's memory as tools for a model, over stdio or streamable HTTP.

Six tools -- ``add_turn``, ``get_context``, ``remember``, ``recall``, ``forget``,
``memory_stats`` -- with flat parameters (strings and numbers) and docstrings written for
the model: when to call the tool and what comes back. Each calls
:class:`~tiermem.service.MemoryService` directly (never the REST handlers). Every id a
caller sends goes through its tenant's :class:`~tiermem.interfaces.tenancy.TenantScope`,
and every id sent back is unscoped again.

Errors are tool errors: a :class:`~tiermem.errors.TierMemError` (bad input, unknown
session, backend down...) becomes a result with ``isError`` and the error's message, so the
model can read what went wrong; nothing fails silently as an empty result.

Tenants:

* **stdio** -- one local client; every call runs as the tenant given on start (``local``
  by default, ``tiermem mcp --tenant NAME``).
* **streamable HTTP** -- every request must carry ``Authorization: Bearer <api key>``
  (the REST API's keys, :class:`~tiermem.interfaces.tenancy.KeyStore`), resolved to its
  tenant per request. Only a server bound to loopback whose keys file has no active key
  serves the ``local`` tenant without a key; binding beyond loopback without keys is
  refused at start (:func:`~tiermem.interfaces.tenancy.check_bind_allowed`). An MCP
  session is bound to the key that opened it (the SDK refuses it to any other key).
  That transport is :mod:`tiermem.interfaces.mcp_http`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from tiermem.errors import NotFoundError, TierMemError, ValidationError
from tiermem.interfaces.display import unscope_text
from tiermem.interfaces.tenancy import LOCAL_TENANT, TenantScope
from tiermem.runtime import loop_factory
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

__all__ = [
    "TenantResolver",
    "build_mcp_server",
    "fixed_tenant",
    "run_stdio",
    "serve_stdio",
]

MAX_TEXT_CHARS = 100_000
"""The longest text one tool call may add or remember (a pasted page, not a book)."""
MAX_QUERY_CHARS = 4_000
"""The longest query of get_context and recall (the REST API's bound)."""
MAX_BUDGET = 200_000
MAX_K = 50

TenantResolver = Callable[[Context], TenantScope]
"""Gives the scope of the caller of one tool call."""

_ROLES = ("user", "assistant")


def _tool_error(exc: TierMemError, scope: TenantScope) -> ToolError:
    """The message the model sees, with the caller's own ids (never the tenant's store
    ids); the error's class name tells it what kind it was."""
    # As the REST API does: every id in a library message is a store id of this tenant.
    return ToolError(f"{type(exc).__name__}: {exc}".replace(f"{scope.tenant}:", ""))


def _check_text(value: str, what: str) -> str:
    if not value.strip():
        raise ValidationError(f"{what} must not be empty")
    if len(value) > MAX_TEXT_CHARS:
        raise ValidationError(f"{what} is {len(value)} characters; the limit is {MAX_TEXT_CHARS}")
    return value


def _check_query(value: str) -> str:
    if len(value) > MAX_QUERY_CHARS:
        raise ValidationError(
            f"query is {len(value)} characters; the limit is {MAX_QUERY_CHARS} (the user's "
            "latest message, not the conversation)"
        )
    return value


def _check_range(value: int, what: str, low: int, high: int) -> int:
    if not low <= value <= high:
        raise ValidationError(f"{what} must be between {low} and {high}, got {value}")
    return value


class _Tools:
    """The tools' logic over one service; every method takes the caller's scope first."""

    def __init__(self, memory: MemoryService) -> None:
        self.memory = memory

    async def add_turn(
        self, scope: TenantScope, session_id: str, user_id: str, role: str, text: str
    ) -> dict[str, Any]:
        if role not in _ROLES:
            raise ValidationError(f"role must be 'user' or 'assistant', got {role!r}")
        _check_text(text, "text")
        session = await self.memory.session(
            scope.scope(session_id, field="session_id"),
            user_id=scope.scope(user_id, field="user_id"),
        )
        turn = await session.add_turn(role, text)
        return {
            "session_id": session_id,
            "index": turn.index,
            "tokens": turn.token_count,
            "importance": round(turn.importance, 3),
            "entities": {e.kind: e.value for e in turn.entities},
        }

    async def get_context(
        self, scope: TenantScope, session_id: str, user_id: str, query: str, budget: int
    ) -> str:
        _check_range(budget, "budget", 256, MAX_BUDGET)
        _check_query(query)
        stored = scope.scope(session_id, field="session_id")
        if await self.memory.tiers.view(stored, refresh_ttl=False) is None:
            raise NotFoundError(f"session {session_id!r} does not exist; call add_turn to start it")
        session = await self.memory.session(stored, user_id=scope.scope(user_id, field="user_id"))
        window = await session.context(query=query or None, budget=budget)
        stats = window.stats
        lines = [
            f"# context for session {session_id}: {stats.total_tokens} of {stats.budget_tokens} "
            f"tokens, {stats.total_turns} turns in the session, {stats.hot_turns} recent"
        ]
        for item in window.items:
            where: str = item.provenance.tier
            if item.provenance.turn_indexes:
                where += f" turns {','.join(str(i) for i in item.provenance.turn_indexes)}"
            label = f"{item.kind}/{item.role}"
            lines.append(f"## {label} ({item.tokens} tokens, from {where})")
            lines.append(item.text)
        return unscope_text("\n".join(lines), scope)

    async def remember(
        self,
        scope: TenantScope,
        user_id: str,
        content: str,
        memory_type: str,
        tags: str,
    ) -> dict[str, Any]:
        _check_text(content, "content")
        record = await self.memory.longterm.remember(
            scope.scope(user_id, field="user_id"),
            content,
            memory_type=memory_type,
            tags=[t.strip() for t in tags.split(",") if t.strip()],
        )
        return {
            "memory_id": record.memory_id,
            "memory_type": record.memory_type,
            "content": record.content,
            "importance": record.importance,
        }

    async def recall(
        self, scope: TenantScope, user_id: str, query: str, k: int, include_turns: bool
    ) -> dict[str, Any]:
        _check_text(query, "query")
        _check_query(query)
        _check_range(k, "k", 1, MAX_K)
        kinds: tuple[Any, ...] = ("memory", "turn") if include_turns else ("memory",)
        hits = await self.memory.longterm.recall(
            scope.scope(user_id, field="user_id"), query, k=k, scope=kinds
        )
        out = []
        for hit in hits:
            text = unscope_text(hit.text, scope)
            item: dict[str, Any] = {"kind": hit.kind, "text": text, "score": hit.score}
            if hit.memory is not None:
                item["memory_id"] = hit.memory.memory_id
                item["memory_type"] = hit.memory.memory_type
            session = hit.session_id or hit.provenance.session_id
            if session is not None and scope.owns(session):
                item["session_id"] = scope.unscope(session)
            if hit.provenance.turn_indexes:
                item["turn_indexes"] = list(hit.provenance.turn_indexes)
            if hit.turn is not None:
                item["turn_index"] = hit.turn.index
            out.append(item)
        return {"query": query, "hits": out}

    async def forget(self, scope: TenantScope, user_id: str, memory_id: str) -> dict[str, Any]:
        deleted = await self.memory.longterm.forget(
            scope.scope(user_id, field="user_id"), memory_id
        )
        if not deleted:
            raise NotFoundError(
                f"user {user_id!r} has no memory {memory_id!r}; call recall to find memory ids"
            )
        return {"forgotten": memory_id}

    async def memory_stats(
        self, scope: TenantScope, user_id: str, session_id: str
    ) -> dict[str, Any]:
        user = scope.scope(user_id, field="user_id")
        stats = await self.memory.longterm.stats(user)
        out: dict[str, Any] = {
            "user_id": user_id,
            "memories": stats.total,
            "memories_by_type": stats.by_type,
            "memory_tokens": stats.total_tokens,
            "sessions": len(await self.memory.list_sessions(user)),
        }
        if session_id:
            stored = scope.scope(session_id, field="session_id")
            view = await self.memory.tiers.view(stored, refresh_ttl=False)
            if view is None or view.metadata.user_id != user:
                raise NotFoundError(f"user {user_id!r} has no session {session_id!r}")
            out["session"] = {
                "session_id": session_id,
                "turns": view.next_index,
                "hot_turns": len(view.turns),
                "hot_tokens": sum(t.token_count for t in view.turns),
                "entities": {k: e.value for k, e in view.entities.items()},
                "expires_at": view.expires_at.isoformat() if view.expires_at else None,
            }
        return out


async def _run(scope: TenantScope, call: Callable[[TenantScope], Awaitable[Any]]) -> Any:
    try:
        return await call(scope)
    except TierMemError as exc:
        raise _tool_error(exc, scope) from exc


class _StrictServer(MCPServer):
    """Refuses an argument a tool does not take, as a tool error naming it: the SDK
    drops unknown arguments, so a misspelt option (``pinned`` for add_turn) would vanish
    without a word."""

    _arguments: dict[str, frozenset[str]] | None = None

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context | None = None
    ) -> Any:
        if self._arguments is None or name not in self._arguments:
            self._arguments = {
                tool.name: frozenset((tool.input_schema or {}).get("properties", {}))
                for tool in await self.list_tools()
            }
        known = self._arguments.get(name)
        unknown = sorted(set(arguments) - known) if known is not None else []
        if known is not None and unknown:
            raise ToolError(
                f"ValidationError: {name} takes no argument {', '.join(map(repr, unknown))}; "
                f"its arguments are {', '.join(sorted(known))}"
            )
        return await super().call_tool(name, arguments, context)


def build_mcp_server(memory: MemoryService, resolve: TenantResolver) -> MCPServer:
    """An MCP server whose six tools call ``memory`` as the tenant ``resolve`` gives."""
    tools = _Tools(memory)
    server: MCPServer = _StrictServer(
        "tiermem",
        log_level="WARNING",  # stdout is the protocol on stdio; the SDK logs to stderr
        instructions=(
            "Memory for this conversation and this user. Call add_turn for every user "
            "message and every reply you give; call get_context before answering to see "
            "what matters; remember durable facts and preferences; recall when the user "
            "refers to something from earlier."
        ),
    )

    @server.tool()
    async def add_turn(session_id: str, user_id: str, role: str, text: str, ctx: Context) -> Any:
        """Record one message of the conversation in memory.

        Call this for every message: once with role "user" for what the user said, and once
        with role "assistant" for your reply. The first call with a new session_id starts
        that session for user_id. Returns the turn's index in the session, its token count,
        its importance (0-1) and the entities found in it (series, volume, order id...).
        """
        return await _run(
            resolve(ctx), lambda scope: tools.add_turn(scope, session_id, user_id, role, text)
        )

    @server.tool()
    async def get_context(
        session_id: str, user_id: str, ctx: Context, query: str = "", budget: int = 4000
    ) -> Any:
        """Get what you should know before answering, assembled to fit a token budget.

        Call this before you answer, with the user's latest message as query. Returns the
        user's profile and relevant long-term memories, active entities, and the recent
        turns of the session, each section labelled with where it came from and its token
        count. Fails if the session does not exist yet (call add_turn first).
        """
        return await _run(
            resolve(ctx),
            lambda scope: tools.get_context(scope, session_id, user_id, query, budget),
        )

    @server.tool()
    async def remember(
        user_id: str,
        content: str,
        ctx: Context,
        memory_type: str = "fact",
        tags: str = "",
    ) -> Any:
        """Store a durable fact about the user in long-term memory, across sessions.

        Call this when the user states something worth knowing next time: a preference
        ("I prefer seinen"), a fact about them, feedback. memory_type is one of fact,
        preference, feedback, episode, interaction_summary, behavioral_pattern; tags is a
        comma-separated list. Saying the same thing twice keeps one memory. Returns the
        memory's id (use it with forget).
        """
        return await _run(
            resolve(ctx),
            lambda scope: tools.remember(scope, user_id, content, memory_type, tags),
        )

    @server.tool()
    async def recall(
        user_id: str, query: str, ctx: Context, k: int = 5, include_turns: bool = False
    ) -> Any:
        """Search the user's long-term memories (and, with include_turns, past messages).

        Call this when the user refers to something from an earlier conversation or you need
        their preferences. Returns up to k hits, best first, each with its text, score,
        memory_id (for forget) and where it came from (session and turn indexes). An empty
        list means nothing relevant is stored.
        """
        return await _run(
            resolve(ctx), lambda scope: tools.recall(scope, user_id, query, k, include_turns)
        )

    @server.tool()
    async def forget(user_id: str, memory_id: str, ctx: Context) -> Any:
        """Delete one long-term memory of the user, by its memory_id from recall or remember.

        Call this when the user asks you to forget something or a memory is wrong. Fails
        if the user has no memory with that id.
        """
        return await _run(resolve(ctx), lambda scope: tools.forget(scope, user_id, memory_id))

    @server.tool()
    async def memory_stats(user_id: str, ctx: Context, session_id: str = "") -> Any:
        """How much is stored for the user: memories by type, their tokens, number of
        sessions; with session_id also that session's turn count, recent (hot) turns and
        tokens, active entities and expiry. Call it to check what memory holds."""
        return await _run(
            resolve(ctx), lambda scope: tools.memory_stats(scope, user_id, session_id)
        )

    return server


# ---------------------------------------------------------------- stdio


def fixed_tenant(tenant: str) -> TenantResolver:
    """Every call runs as ``tenant`` (stdio: the process owner is the one client)."""
    scope = TenantScope(tenant)

    def resolve(ctx: Context) -> TenantScope:
        return scope

    return resolve


async def serve_stdio(memory: MemoryService, tenant: str = LOCAL_TENANT.id) -> None:
    """Serve ``memory`` over stdin/stdout as ``tenant`` until the client disconnects."""
    await build_mcp_server(memory, fixed_tenant(tenant)).run_stdio_async()


def run_stdio(settings: TierMemSettings, tenant: str = LOCAL_TENANT.id) -> None:
    """Open the service the settings describe and serve it over stdio (blocks)."""
    TenantScope(tenant)  # validate before opening anything
    factory = loop_factory(settings.event_loop)

    async def main() -> None:
        memory = MemoryService.from_settings(settings)
        try:
            await serve_stdio(memory, tenant)
        finally:
            await memory.aclose()

    anyio.run(main, backend_options={"loop_factory": factory})
