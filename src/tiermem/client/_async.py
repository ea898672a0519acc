"""The async REST client: the in-process library's method names, over HTTP."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from tiermem.client.errors import (
    RateLimitedError,
    error_from_response,
    error_from_transport,
    retry_after_of,
)
from tiermem.context import ContextWindow
from tiermem.errors import NotFoundError, TierMemError
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.knowledge import KnowledgeDocument
from tiermem.longterm.records import UserMemoryStats
from tiermem.models import MemoryRecord, SessionMetadata, SessionRef, StateBlob, Turn
from tiermem.retry import backoff_delay
from tiermem.session import SessionStats

__all__ = ["AsyncTierMemClient", "RemoteSession"]

_RETRY_STATUSES = frozenset({502, 503, 504})
_PAGE = 1_000  # the server's largest turn range per request


def _path(segment: str) -> str:
    """Quote an id for a URL path (every character but unreserved ones)."""
    return quote(segment, safe="")


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


class AsyncTierMemClient:
    """A client of the tiermem REST API with the library's method names.

    ::

        async with AsyncTierMemClient("http://127.0.0.1:8080", api_key=key) as client:
            session = await client.open_session("u-1")
            await session.add_turn("user", "I prefer seinen")
            window = await session.context("berserk", budget=4000)

    Calls that are safe to repeat are retried on a connection failure, a timeout, a 429 or a
    503 (``max_retries`` times, waiting for ``Retry-After`` up to ``max_retry_wait`` seconds,
    with jittered backoff): every read, remember (deduplicated by content), and add_turn,
    which always sends an ``Idempotency-Key`` (one is generated per call when none is
    given), so a retry after a lost answer returns the stored turn instead of adding it
    twice. Errors come back as tiermem's own exceptions (:mod:`tiermem.client.errors`).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_retry_wait: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    # -- plumbing ----------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        retry: bool,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        files: Any = None,
        data: Any = None,
    ) -> Any:
        """Send one API request (with retries when ``retry``); return the JSON answer.

        Raises:
            TierMemError: the mapped error of the last attempt.
        """
        attempt = 0
        while True:
            wait: float | None = None
            try:
                response = await self._http.request(
                    method,
                    path,
                    json=_jsonable(json) if json is not None else None,
                    params=params,
                    headers=headers,
                    files=files,
                    data=data,
                )
            except httpx.TransportError as exc:
                # A refused connection never reached the server: safe to repeat anything.
                unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if attempt >= self.max_retries or not (retry or unsent):
                    raise error_from_transport(exc, self.base_url + path) from exc
                wait = 0.0
            else:
                if response.is_success:
                    return response.json() if response.content else None
                error = error_from_response(response)
                # A 429 is answered before any handler runs: repeating it is always safe.
                retryable = isinstance(error, RateLimitedError) or (
                    retry and response.status_code in _RETRY_STATUSES
                )
                if attempt >= self.max_retries or not retryable:
                    raise error
                wait = retry_after_of(response, default=0.0)
            delay = max(min(wait, self.max_retry_wait), backoff_delay(attempt, base=0.05, cap=2.0))
            await asyncio.sleep(delay)
            attempt += 1

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- sessions ----------------------------------------------------------------------

    async def open_session(
        self,
        user_id: str,
        session_id: str | None = None,
        *,
        user_tier: str = "standard",
        locale: str = "en-US",
    ) -> RemoteSession:
        """Resume ``session_id`` if it exists, else create it (a new id when None)."""
        body = {"user_id": user_id, "user_tier": user_tier, "locale": locale}
        if session_id is not None:
            body["session_id"] = session_id
        # Opening a named session is idempotent; a new one gets its id only from the server.
        data = await self.request("POST", "/v1/sessions", json=body, retry=session_id is not None)
        return RemoteSession(self, SessionMetadata.model_validate(data["metadata"]))

    async def session(
        self,
        session_id: str | None = None,
        *,
        user_id: str,
        user_tier: str = "standard",
        locale: str = "en-US",
    ) -> RemoteSession:
        """:meth:`open_session` with :meth:`MemoryService.session`'s signature."""
        return await self.open_session(user_id, session_id, user_tier=user_tier, locale=locale)

    async def get_session(self, session_id: str) -> RemoteSession:
        """A handle on an existing session.

        Raises:
            NotFoundError: no such session.
        """
        data = await self.request("GET", f"/v1/sessions/{_path(session_id)}", retry=True)
        return RemoteSession(self, SessionMetadata.model_validate(data["metadata"]))

    async def list_sessions(self, user_id: str, *, limit: int = 100) -> list[SessionRef]:
        data = await self.request(
            "GET", f"/v1/users/{_path(user_id)}/sessions", params={"limit": limit}, retry=True
        )
        return [SessionRef.model_validate(s) for s in data["sessions"]]

    # -- long-term memory --------------------------------------------------------------

    async def remember(
        self,
        user_id: str,
        content: str,
        *,
        memory_type: str = "fact",
        tags: Sequence[str] = (),
        importance: float | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> MemoryRecord:
        """Remember a memory; the same content of the same type is one record."""
        body: dict[str, Any] = {"content": content, "memory_type": memory_type, "tags": list(tags)}
        if importance is not None:
            body["importance"] = importance
        if metadata is not None:
            body["metadata"] = dict(metadata)
        data = await self.request(
            "POST", f"/v1/users/{_path(user_id)}/memories", json=body, retry=True
        )
        return MemoryRecord.model_validate(data)

    async def get_memory(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        try:
            data = await self.request(
                "GET", f"/v1/users/{_path(user_id)}/memories/{_path(memory_id)}", retry=True
            )
        except NotFoundError:
            return None
        return MemoryRecord.model_validate(data)

    async def list_memories(
        self,
        user_id: str,
        *,
        types: Sequence[str] | None = None,
        include_superseded: bool = False,
        limit: int = 100,
    ) -> list[MemoryRecord]:
        params: dict[str, Any] = {"limit": limit, "include_superseded": include_superseded}
        if types is not None:
            params["memory_type"] = list(types)
        data = await self.request(
            "GET", f"/v1/users/{_path(user_id)}/memories", params=params, retry=True
        )
        return [MemoryRecord.model_validate(m) for m in data["memories"]]

    async def recall(
        self,
        user_id: str,
        query: str,
        *,
        k: int = 5,
        types: Sequence[str] | None = None,
        scope: Sequence[str] = ("memory",),
        min_importance: float = 0.0,
    ) -> list[RecallHit]:
        body: dict[str, Any] = {
            "query": query,
            "k": k,
            "scope": list(scope),
            "min_importance": min_importance,
        }
        if types is not None:
            body["types"] = list(types)
        data = await self.request(
            "POST", f"/v1/users/{_path(user_id)}/recall", json=body, retry=True
        )
        return [RecallHit.model_validate(h) for h in data["hits"]]

    async def forget(self, user_id: str, memory_id: str) -> bool:
        """Forget one memory; False when there was none."""
        data = await self.request(
            "DELETE", f"/v1/users/{_path(user_id)}/memories/{_path(memory_id)}", retry=True
        )
        return bool(data["forgotten"])

    async def purge_user(self, user_id: str) -> int:
        """Delete everything of the user; returns the sessions and memories deleted."""
        data = await self.request("DELETE", f"/v1/users/{_path(user_id)}", retry=True)
        return int(data["deleted"])

    async def user_stats(self, user_id: str) -> UserMemoryStats:
        data = await self.request("GET", f"/v1/users/{_path(user_id)}/stats", retry=True)
        return UserMemoryStats.model_validate(data)

    # -- knowledge documents -----------------------------------------------------------

    async def add_document(
        self, user_id: str, name: str, data: bytes | str, *, tags: Sequence[str] = ()
    ) -> KnowledgeDocument:
        """Upload a document (txt, md, pdf, docx by ``name``'s extension).

        Not retried after it was sent (an upload is not idempotent)."""
        content = data.encode("utf-8") if isinstance(data, str) else data
        form = {"tags": list(tags)} if tags else None
        answer = await self.request(
            "POST",
            f"/v1/users/{_path(user_id)}/documents",
            files={"file": (name, content)},
            data=form,
            retry=False,
        )
        return KnowledgeDocument.model_validate(answer)

    async def list_documents(self, user_id: str, *, limit: int = 100) -> list[KnowledgeDocument]:
        data = await self.request(
            "GET", f"/v1/users/{_path(user_id)}/documents", params={"limit": limit}, retry=True
        )
        return [KnowledgeDocument.model_validate(d) for d in data["documents"]]

    async def delete_document(self, user_id: str, document_id: str) -> bool:
        data = await self.request(
            "DELETE", f"/v1/users/{_path(user_id)}/documents/{_path(document_id)}", retry=True
        )
        return bool(data["deleted"])

    # -- operations --------------------------------------------------------------------

    async def tools(self) -> list[dict[str, Any]]:
        data = await self.request("GET", "/v1/tools", retry=True)
        return list(data["tools"])

    async def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = await self.request("GET", "/v1/stats", retry=True)
        return data

    async def ready(self) -> bool:
        """Whether the server and its backends answer."""
        try:
            await self.request("GET", "/readyz", retry=False)
        except TierMemError:  # every failure of the call is mapped to one
            return False
        return True


class RemoteSession:
    """One session through the API, with :class:`tiermem.session.Session`'s methods."""

    def __init__(self, client: AsyncTierMemClient, metadata: SessionMetadata) -> None:
        self._client = client
        self._metadata = metadata
        self._base = f"/v1/sessions/{_path(metadata.session_id)}"

    @property
    def id(self) -> str:
        return self._metadata.session_id

    @property
    def user_id(self) -> str:
        return self._metadata.user_id

    async def add_turn(
        self,
        role: str,
        content: Any,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Turn:
        """Add a turn. Always keyed (a key is generated when none is given), so the
        client's retries never add it twice.

        ``options``: timestamp, importance, pinned, agent_name, intent, latency_ms, metadata.
        """
        key = idempotency_key or f"sdk-{uuid.uuid4().hex}"
        body: dict[str, Any] = {"role": role, "content": content, **options}
        if "timestamp" in body and hasattr(body["timestamp"], "isoformat"):
            body["timestamp"] = body["timestamp"].isoformat()
        data = await self._client.request(
            "POST",
            f"{self._base}/turns",
            json=body,
            headers={"Idempotency-Key": key},
            retry=True,
        )
        return Turn.model_validate(data)

    async def get_turn(self, index: int) -> Turn:
        data = await self._client.request("GET", f"{self._base}/turns/{index}", retry=True)
        return Turn.model_validate(data)

    async def get_turns(self, start: int = 0, end: int | None = None) -> list[Turn]:
        """Archived turns with ``start <= index < end`` (all from ``start`` when None),
        read in pages of 1,000."""
        turns: list[Turn] = []
        while end is None or start < end:
            stop = start + _PAGE if end is None else min(end, start + _PAGE)
            data = await self._client.request(
                "GET",
                f"{self._base}/turns",
                params={"start": start, "end": stop},
                retry=True,
            )
            page = [Turn.model_validate(t) for t in data["turns"]]
            turns += page
            if end is None and len(page) < stop - start:
                break
            start = stop
        return turns

    async def history(self) -> tuple[Turn, ...]:
        data = await self._client.request("GET", f"{self._base}/history", retry=True)
        return tuple(Turn.model_validate(t) for t in data["turns"])

    async def context(
        self,
        query: str | None = None,
        budget: int | None = None,
        model: str | None = None,
        system: str | None = None,
        tools: Sequence[Any] | None = None,
        *,
        current: str | None = None,
        recall_k: int = 8,
    ) -> ContextWindow:
        body: dict[str, Any] = {"recall_k": recall_k, "tools": list(tools or ())}
        for name, value in (
            ("query", query),
            ("budget", budget),
            ("model", model),
            ("system", system),
            ("current", current),
        ):
            if value is not None:
                body[name] = value
        data = await self._client.request("POST", f"{self._base}/context", json=body, retry=True)
        return ContextWindow.model_validate(data)

    async def stats(self) -> SessionStats:
        data = await self._client.request("GET", f"{self._base}/stats", retry=True)
        return SessionStats.model_validate(data)

    async def metadata(self) -> SessionMetadata:
        data = await self._client.request("GET", self._base, retry=True)
        self._metadata = SessionMetadata.model_validate(data["metadata"])
        return self._metadata

    async def close(self) -> SessionMetadata:
        data = await self._client.request("POST", f"{self._base}/close", retry=True)
        self._metadata = SessionMetadata.model_validate(data)
        return self._metadata

    async def get_state(self, name: str, *, fresh: bool = False) -> StateBlob | None:
        try:
            data = await self._client.request(
                "GET",
                f"{self._base}/state/{_path(name)}",
                params={"fresh": fresh},
                retry=True,
            )
        except NotFoundError:
            return None
        return StateBlob.model_validate(data)

    async def put_state(
        self, name: str, data: Mapping[str, Any], *, expected_version: int | None = None
    ) -> StateBlob:
        """Write a state blob. Retried only as compare-and-set (with ``expected_version``):
        a blind write repeated after a lost answer would bump the version twice."""
        body: dict[str, Any] = {"data": dict(data)}
        if expected_version is not None:
            body["expected_version"] = expected_version
        answer = await self._client.request(
            "PUT",
            f"{self._base}/state/{_path(name)}",
            json=body,
            retry=expected_version is not None,
        )
        return StateBlob.model_validate(answer)
