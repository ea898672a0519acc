"""The web inspector: a self-contained page (no build step, no CDN, no network) served by the
REST API under ``/inspector``, and the JSON it reads.

* ``GET /inspector/`` -- the page (HTML, JS and CSS from ``inspector_static/``). The shell
  holds no data, so it is served without a key; it asks for one and sends it as a Bearer
  header with every data request.
* ``GET /inspector/api/...`` -- the data, through the API's own authentication
  (:func:`tiermem.interfaces.api.deps.authenticate`): every id is scoped to the caller's
  tenant and stripped from the answers. Sessions of a user; a session's metadata, hot and
  archived turns, summaries by tier, structured memory, entities, state, durable records
  and stats; a context-window preview with each item's tokens and provenance, against the
  tokens of the full history; the user's memories with provenance; recall; the server's
  tools with their breaker health.

Everything is read through :class:`~tiermem.service.MemoryService`; nothing here writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.responses import FileResponse, JSONResponse

from tiermem.errors import NotFoundError, ValidationError
from tiermem.interfaces.api.deps import Caller, answer, api_state, authenticate
from tiermem.interfaces.api.route_table import RouteTable
from tiermem.interfaces.api.routes_ops import public_tool_message
from tiermem.interfaces.display import unscope_text
from tiermem.models.content import text_of
from tiermem.service import MemoryService
from tiermem.session import Session
from tiermem.tiers.tiered import SessionView

__all__ = ["STATIC_DIR", "router"]

STATIC_DIR = Path(__file__).with_name("inspector_static")
RECORD_KINDS = ("metadata", "entities", "state", "summary", "summaries", "structured_memory")
"""Durable session records shown (the store has no listing of a session's record kinds)."""
_ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

router = RouteTable(prefix="/inspector", tags=["inspector"])
CallerDep = Annotated[Caller, Depends(authenticate)]


def _service(request: Request) -> MemoryService:
    return api_state(request).service


# ---------------------------------------------------------------- the page


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    """The inspector page (no data in it)."""
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html; charset=utf-8")


@router.get("/static/{name}", include_in_schema=False)
async def asset(name: str) -> FileResponse:
    """The page's script and style (a fixed list: no path from the request reaches the
    file system)."""
    media = _ASSETS.get(name)
    if media is None:
        raise NotFoundError(f"no inspector asset {name!r}")
    return FileResponse(STATIC_DIR / name, media_type=media)


# ---------------------------------------------------------------- data


async def _view(request: Request, caller: Caller, session_id: str) -> SessionView:
    stored = caller.scope.scope(session_id, field="session_id")
    view = await _service(request).tiers.view(stored, refresh_ttl=False)
    if view is None or not caller.scope.owns(view.metadata.user_id):
        raise NotFoundError(f"session {session_id!r} not found")
    return view


def _turn(turn: Any) -> dict[str, Any]:
    return {
        "index": turn.index,
        "role": turn.role,
        "timestamp": turn.timestamp.isoformat(),
        "tokens": turn.token_count,
        "importance": turn.importance,
        "pinned": turn.pinned,
        "redacted": turn.redacted,
        "entities": [e.model_dump(mode="json") for e in turn.entities],
        "text": text_of(turn.content),
    }


@router.get("/api/users/{user_id}/sessions")
async def user_sessions(
    user_id: str,
    caller: CallerDep,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> JSONResponse:
    """The user's sessions, newest first, with their turn counts (0 for an expired one)."""
    memory = _service(request)
    refs = await memory.list_sessions(caller.scope.scope(user_id, field="user_id"), limit=limit)
    sessions = []
    for ref in refs:
        view = await memory.tiers.view(ref.session_id, refresh_ttl=False)
        sessions.append(
            {
                "session_id": ref.session_id,
                "created_at": ref.created_at.isoformat(),
                "turns": view.next_index if view else 0,
                "live": view is not None,
                "closed": bool(view and view.metadata.closed_at),
            }
        )
    return answer(caller, {"user_id": user_id, "sessions": sessions})


@router.get("/api/sessions/{session_id}")
async def session_detail(
    session_id: str,
    caller: CallerDep,
    request: Request,
    archived_limit: Annotated[int, Query(ge=0, le=1000)] = 200,
) -> JSONResponse:
    """A session: metadata, hot turns, the archived turns before the hot window (up to
    ``archived_limit``, newest of them), entities, state, durable records, stats."""
    memory = _service(request)
    view = await _view(request, caller, session_id)
    first_hot = view.turns[0].index if view.turns else view.next_index
    start = max(0, first_hot - archived_limit)
    archived = await memory.tiers.get_turns(view.metadata.session_id, start, first_hot)
    session = Session(memory, view)
    stats = await session.stats()
    found = await memory.summaries.read(view.metadata.session_id)
    records = []
    for kind in RECORD_KINDS:
        record = await memory.tiers.durable.get_record(view.metadata.session_id, kind)
        if record is not None:
            records.append(
                {
                    "kind": kind,
                    "version": record.version,
                    "updated_at": record.updated_at.isoformat(),
                    "bytes": len(json.dumps(record.data, ensure_ascii=False).encode()),
                    "data": record.data if kind not in ("metadata",) else None,
                }
            )
    body = {
        "metadata": view.metadata.model_dump(mode="json"),
        "served_from": view.source,
        "expires_at": view.expires_at.isoformat() if view.expires_at else None,
        "hot_turns": [_turn(t) for t in view.turns],
        "archived_turns": [_turn(t) for t in archived],
        "archived_before": start,
        "entities": [e.model_dump(mode="json") for e in view.entities.values()],
        "state": [b.model_dump(mode="json") for b in view.state.values()],
        "records": records,
        "summaries": {
            "tiers": [
                {**t.model_dump(mode="json"), "text": unscope_text(t.text, caller.scope)}
                for t in found.tiers
            ],
            "watermarks": found.watermarks.model_dump(mode="json"),
            "compression": found.compression.model_dump(mode="json"),
            "quality": found.quality.model_dump(mode="json") if found.quality else None,
        },
        "structured": found.structured.model_dump(mode="json"),
        "stats": stats.model_dump(mode="json"),
    }
    return answer(caller, body)


@router.get("/api/sessions/{session_id}/context")
async def context_preview(
    session_id: str,
    caller: CallerDep,
    request: Request,
    query: str = "",
    budget: Annotated[int, Query(ge=256, le=200_000)] = 8000,
) -> JSONResponse:
    """What :meth:`Session.context` would send the model now: each item with its kind,
    tokens and provenance, and the window's stats."""
    view = await _view(request, caller, session_id)
    memory = _service(request)
    session = Session(memory, view)
    window = await session.context(query=query or None, budget=budget)
    history = await memory.tiers.get_turns(view.metadata.session_id, 0, view.next_index)
    items = [
        {
            "kind": item.kind,
            "role": item.role,
            "name": item.name,
            "tokens": item.tokens,
            "truncated": item.truncated,
            "provenance": item.provenance.model_dump(mode="json"),
            "text": unscope_text(item.text, caller.scope),
        }
        for item in window.items
    ]
    body = {
        "items": items,
        "stats": window.stats.model_dump(mode="json"),
        "history_tokens": sum(t.token_count for t in history),
    }
    return answer(caller, body)


@router.get("/api/users/{user_id}/memories")
async def user_memories(
    user_id: str,
    caller: CallerDep,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> JSONResponse:
    """The user's current memories, newest first, with provenance (session, turns)."""
    memory = _service(request)
    records = await memory.longterm.list(caller.scope.scope(user_id, field="user_id"), limit=limit)
    out = [r.model_dump(mode="json", exclude={"embedding", "embedding_model"}) for r in records]
    return answer(caller, {"user_id": user_id, "memories": out})


@router.get("/api/users/{user_id}/recall")
async def user_recall(
    user_id: str,
    caller: CallerDep,
    request: Request,
    q: Annotated[str, Query(min_length=1, max_length=2000)],
    k: Annotated[int, Query(ge=1, le=50)] = 8,
    turns: bool = True,
) -> JSONResponse:
    """Recall over the user's memories (and archived turns, and document chunks)."""
    if not q.strip():
        raise ValidationError("q must not be blank")
    memory = _service(request)
    scope: tuple[Any, ...] = ("memory", "turn", "chunk") if turns else ("memory",)
    hits = await memory.longterm.recall(
        caller.scope.scope(user_id, field="user_id"), q, k=k, scope=scope
    )
    out = [
        {
            "kind": h.kind,
            "score": h.score,
            "components": h.components,
            "text": unscope_text(h.text, caller.scope),
            "memory_id": h.memory.memory_id if h.memory else None,
            "memory_type": h.memory.memory_type if h.memory else None,
            "session_id": h.session_id or h.provenance.session_id,
            "turn_indexes": list(h.provenance.turn_indexes),
        }
        for h in hits
    ]
    return answer(caller, {"query": q, "hits": out})


@router.get("/api/tools")
async def tool_health(caller: CallerDep, request: Request) -> JSONResponse:
    """The server's tools: health, breaker state, this process's calls and failures (no
    error texts: they may quote another tenant's call)."""
    statuses = await api_state(request).dispatcher.statuses()
    tools = [
        {
            "name": s.name,
            "health": s.health.value,
            "breaker": s.breaker.value,
            "recent_failures": s.recent_failures,
            "retry_at": s.retry_at.isoformat() if s.retry_at else None,
            "fallbacks": list(s.fallbacks),
            "calls": s.stats.calls,
            "failures": s.stats.errors + s.stats.timeouts,
            "message": public_tool_message(s),  # without the shared last error text
        }
        for s in statuses
    ]
    return answer(caller, {"tools": tools})
