"""The Python client SDK: through the ASGI app, and against a real uvicorn server on a
loopback port for the retry path (a lost answer, 503s) and the sync facade."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tiermem.client import (
    AsyncTierMemClient,
    AuthenticationError,
    RequestRejectedError,
    TierMemClient,
)
from tiermem.errors import (
    BackendTimeoutError,
    BackendUnavailableError,
    ConflictError,
    NotFoundError,
)
from tiermem.interfaces.api import create_app
from tiermem.interfaces.tenancy import KeyStore
from tiermem.settings import TierMemSettings

from .conftest import Keys, serving


@pytest.fixture
def sdk(app: FastAPI, keys: Keys) -> AsyncTierMemClient:
    return AsyncTierMemClient(
        "http://testserver", api_key=keys.a, transport=httpx.ASGITransport(app)
    )


async def test_the_sdk_speaks_the_librarys_method_names(sdk: AsyncTierMemClient) -> None:
    async with sdk:
        session = await sdk.open_session("u-1", "s-1")
        assert (session.id, session.user_id) == ("s-1", "u-1")
        first = await session.add_turn("user", "I prefer seinen. Is Berserk vol 42 in stock?")
        second = await session.add_turn(
            "assistant", [{"type": "text", "text": "Yes, in stock."}], intent="stock"
        )
        assert (first.index, second.index, second.intent) == (0, 1, "stock")
        assert (await session.get_turn(1)).text == "Yes, in stock."
        assert [t.index for t in await session.get_turns()] == [0, 1]
        assert [t.index for t in await session.get_turns(1, 2)] == [1]
        assert len(await session.history()) == 2
        window = await session.context("berserk", budget=2000)
        assert window.stats.total_turns == 2
        assert (await session.stats()).turn_count == 2
        blob = await session.put_state("plan", {"step": 1})
        assert (await session.get_state("plan")) == blob
        assert await session.get_state("nothing") is None
        with pytest.raises(ConflictError):
            await session.put_state("plan", {"step": 9}, expected_version=7)
        closed = await session.close()
        assert closed.closed_at is not None

        again = await sdk.session("s-1", user_id="u-1")
        assert (await again.metadata()).turn_count == 2
        assert [r.session_id for r in await sdk.list_sessions("u-1")] == ["s-1"]

        record = await sdk.remember("u-1", "Lives in Osaka")
        hits = await sdk.recall("u-1", "Osaka")
        assert [h.doc_id for h in hits] == [record.memory_id]
        assert (await sdk.get_memory("u-1", record.memory_id)) == record
        assert record.memory_id in {m.memory_id for m in await sdk.list_memories("u-1")}
        assert await sdk.forget("u-1", record.memory_id) is True
        assert await sdk.forget("u-1", record.memory_id) is False

        document = await sdk.add_document("u-1", "faq.md", "# FAQ\n\nShipping takes 2 days.")
        assert [d.document_id for d in await sdk.list_documents("u-1")] == [document.document_id]
        assert await sdk.delete_document("u-1", document.document_id) is True

        assert (await sdk.user_stats("u-1")).user_id == "u-1"
        assert await sdk.tools() == []
        assert "hot_hits" in await sdk.stats()
        assert await sdk.ready() is True
        assert await sdk.purge_user("u-1") >= 1
        with pytest.raises(NotFoundError):
            await sdk.get_session("s-1")


async def test_http_errors_come_back_as_tiermem_exceptions(
    app: FastAPI, sdk: AsyncTierMemClient
) -> None:
    async with sdk:
        with pytest.raises(RequestRejectedError) as info:
            await sdk.open_session("u\n1")
        assert info.value.field == "user_id"
        assert isinstance(info.value, ValueError)  # a ValidationError, as in the library
        session = await sdk.open_session("u-1", "s-1")
        with pytest.raises(NotFoundError):
            await session.get_turn(5)
    anonymous = AsyncTierMemClient("http://testserver", transport=httpx.ASGITransport(app))
    async with anonymous:
        with pytest.raises(AuthenticationError):
            await anonymous.recall("u-1", "x")


# -- against a real server ------------------------------------------------------------


@dataclass
class Faults:
    """Faults injected in front of the real app, at the HTTP layer: ``unavailable`` next
    requests get a 503; ``lose_answers`` next turn writes run to completion but their
    answer is held past the client's timeout (a lost answer)."""

    app: ASGIApp
    unavailable: int = 0
    lose_answers: int = 0
    hold_seconds: float = 2.5
    keys_seen: list[str | None] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["method"] == "POST" and scope["path"].endswith("/turns"):
            key = headers.get(b"idempotency-key")
            self.keys_seen.append(key.decode() if key else None)
        if self.unavailable:
            self.unavailable -= 1
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [(b"retry-after", b"0"), (b"content-type", b"application/json")],
                }
            )
            body = b'{"error": {"code": "unavailable", "message": "injected", "field": null}}'
            await send({"type": "http.response.body", "body": body})
            return
        if self.lose_answers and scope["method"] == "POST" and scope["path"].endswith("/turns"):
            self.lose_answers -= 1
            held: list[Message] = []

            async def hold(message: Message) -> None:
                held.append(message)

            await self.app(scope, receive, hold)  # the turn is stored ...
            await asyncio.sleep(self.hold_seconds)  # ... the answer arrives too late
            for message in held:
                await send(message)
            return
        await self.app(scope, receive, send)


@dataclass
class RunningServer:
    url: str
    faults: Faults
    key: str


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    """A uvicorn server on a free loopback port, in a thread, with its own service."""
    settings = TierMemSettings(
        sqlite_path=tmp_path / "server.db", api_keys_file=tmp_path / "server-keys.json"
    )
    _, key = KeyStore(tmp_path / "server-keys.json").create("acme")
    faults = Faults(create_app(settings))
    with serving(faults) as port:
        yield RunningServer(f"http://127.0.0.1:{port}", faults, key)


async def test_a_retry_after_a_lost_answer_never_duplicates_the_turn(
    server: RunningServer,
) -> None:
    client = AsyncTierMemClient(server.url, api_key=server.key, timeout=1.0, max_retry_wait=0.05)
    async with client:
        session = await client.open_session("u-1", "s-1")
        server.faults.lose_answers = 1
        turn = await session.add_turn("user", "Order Berserk 42, please")
        assert turn.index == 0
        # The SDK sent the same generated key again (twice, or more on a slow machine): the
        # server stored one turn.
        assert len(server.faults.keys_seen) >= 2
        assert len(set(server.faults.keys_seen)) == 1
        assert server.faults.keys_seen[0] is not None
        assert [t.index for t in await session.get_turns()] == [0]

        server.faults.unavailable = 2  # two 503s, then the real answer
        seen = len(server.faults.keys_seen)
        second = await session.add_turn("user", "And volume 43")
        assert second.index == 1
        assert len(server.faults.keys_seen) - seen >= 3
        assert len(set(server.faults.keys_seen[seen:])) == 1
        assert [t.text for t in await session.get_turns()] == [
            "Order Berserk 42, please",
            "And volume 43",
        ]


async def test_retries_give_up_with_a_clear_error(server: RunningServer) -> None:
    client = AsyncTierMemClient(
        server.url, api_key=server.key, timeout=1.0, max_retries=2, max_retry_wait=0.05
    )
    async with client:
        session = await client.open_session("u-1", "s-1")
        server.faults.unavailable = 3
        with pytest.raises(BackendUnavailableError):
            await session.add_turn("user", "hello")
        server.faults.lose_answers = 3
        with pytest.raises(BackendTimeoutError):
            await session.add_turn("user", "hello again", idempotency_key="mine")
        # Every attempt carried the caller's key: once the server answers, still one turn.
        assert server.faults.keys_seen[-3:] == ["mine"] * 3
        turn = await session.add_turn("user", "hello again", idempotency_key="mine")
        assert [t.index for t in await session.get_turns()] == [turn.index]


def test_the_sync_facade_against_a_real_server(server: RunningServer) -> None:
    with TierMemClient(server.url, api_key=server.key) as client:
        session = client.open_session("u-1", "s-1")
        turn = session.add_turn("user", "I prefer seinen")
        assert turn.index == 0
        assert session.context("seinen", budget=1000).stats.total_turns == 1
        assert client.remember("u-1", "Lives in Osaka").content == "Lives in Osaka"
        assert session.close().closed_at is not None
    bad_key = "tm_0123456789abcdef_" + "a" * 43
    with TierMemClient(server.url, api_key=bad_key) as bad, pytest.raises(AuthenticationError):
        bad.open_session("u-1")
