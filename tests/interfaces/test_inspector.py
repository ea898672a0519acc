"""The web inspector through the REST app (ASGI transport): the page and its assets, and the
data routes -- behind the API's authentication, scoped to the caller's tenant, reading hot
vs archived turns, entities, state, records, a context preview with provenance and tokens,
memories with provenance, and recall."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.interfaces.processes import free_port, start_tiermem, stop
from tiermem.interfaces.api.app import create_app
from tiermem.interfaces.tenancy import KeyStore
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings


@dataclass
class Setup:
    client: httpx.AsyncClient
    memory: MemoryService
    keys: KeyStore


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    settings = TierMemSettings(
        sqlite_path=tmp_path / "t.db", api_keys_file=tmp_path / "keys.json", hot_window=3
    )
    memory = MemoryService.from_settings(settings)
    keys = KeyStore(tmp_path / "keys.json")
    app = create_app(settings, service=memory, keystore=keys, allow_anonymous=True)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        try:
            yield Setup(client, memory, keys)
        finally:
            await memory.aclose()


async def seed(memory: MemoryService, tenant: str) -> None:
    session = await memory.session(f"{tenant}:s-1", user_id=f"{tenant}:u-1")
    texts = [
        "I prefer seinen. Do you have Berserk vol 42?",
        "Yes, volume 42 is in stock.",
        "Add it to my cart please.",
        "Done: order #A-1001.",
        "Thanks!",
    ]
    for i, text in enumerate(texts):
        await session.add_turn("user" if i % 2 == 0 else "assistant", text)
    await session.put_state("cart", {"items": ["berserk-42"]})
    await memory.drain()


async def test_the_page_and_its_assets_are_served(setup: Setup) -> None:
    page = await setup.client.get("/inspector/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "tiermem inspector" in page.text
    assert "http" not in page.text.replace('name="viewport"', "")  # nothing from the network
    script = await setup.client.get("/inspector/static/app.js")
    assert script.status_code == 200
    assert "javascript" in script.headers["content-type"]
    assert "fetch(" in script.text
    assert (await setup.client.get("/inspector/static/style.css")).status_code == 200
    assert (await setup.client.get("/inspector/static/..%2Fjsonl.py")).status_code == 404
    assert (await setup.client.get("/inspector/static/secrets.txt")).status_code == 404


ROUTES = [
    "/inspector/api/users/u-1/sessions",
    "/inspector/api/sessions/s-1",
    "/inspector/api/sessions/s-1/context?query=berserk",
    "/inspector/api/users/u-1/memories",
    "/inspector/api/users/u-1/recall?q=seinen",
]


async def test_data_routes_need_a_key_and_see_only_their_tenant(setup: Setup) -> None:
    await seed(setup.memory, "tenant-a")
    _, key_a = setup.keys.create("tenant-a")
    _, key_b = setup.keys.create("tenant-b")
    for route in ROUTES:
        anonymous = await setup.client.get(route)
        assert anonymous.status_code == 401, route
        wrong = await setup.client.get(route, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401, route
        own = await setup.client.get(route, headers={"Authorization": f"Bearer {key_a}"})
        assert own.status_code == 200, (route, own.text)
        assert "tenant-a" not in own.text  # every id is the caller's, unscoped
        other = await setup.client.get(route, headers={"Authorization": f"Bearer {key_b}"})
        assert other.status_code in (200, 404), route
        seen = other.text.replace('"query":"seinen"', "")  # the echo of B's own query
        assert "Berserk" not in seen, route
        assert "seinen" not in seen, route
        assert "s-1" not in seen or other.status_code == 404, route


async def test_session_detail_splits_hot_and_archived_turns(setup: Setup) -> None:
    await seed(setup.memory, "local")  # keyless loopback caller: the local tenant
    body = (await setup.client.get("/inspector/api/sessions/s-1")).json()
    assert body["metadata"]["session_id"] == "s-1"
    assert body["metadata"]["user_id"] == "u-1"
    assert [t["index"] for t in body["hot_turns"]] == [2, 3, 4]
    assert [t["index"] for t in body["archived_turns"]] == [0, 1]
    assert body["archived_turns"][0]["text"].startswith("I prefer seinen")
    kinds = {e["kind"]: e["value"] for e in body["entities"]}
    assert kinds["volume"] == "42"
    assert body["state"][0]["name"] == "cart"
    assert {r["kind"] for r in body["records"]} >= {"metadata", "entities", "state"}
    assert body["stats"]["turn_count"] == 5

    sessions = (await setup.client.get("/inspector/api/users/u-1/sessions")).json()
    assert sessions["sessions"][0] == {
        "session_id": "s-1",
        "created_at": sessions["sessions"][0]["created_at"],
        "turns": 5,
        "live": True,
        "closed": False,
    }
    missing = await setup.client.get("/inspector/api/sessions/nope")
    assert missing.status_code == 404


async def test_context_preview_has_tokens_and_provenance(setup: Setup) -> None:
    await seed(setup.memory, "local")
    answer = await setup.client.get(
        "/inspector/api/sessions/s-1/context", params={"query": "seinen", "budget": 4000}
    )
    body = answer.json()
    items = body["items"]
    turns = [i for i in items if i["kind"] == "turn"]
    assert [i["provenance"]["turn_indexes"] for i in turns][-1] == [4]
    assert all(i["tokens"] > 0 for i in items)
    assert all(i["provenance"].get("session_id") in (None, "s-1") for i in items)
    assert body["stats"]["budget_tokens"] == 4000
    assert body["stats"]["total_tokens"] == sum(i["tokens"] for i in items)
    bad = await setup.client.get("/inspector/api/sessions/s-1/context", params={"budget": 10})
    assert 400 <= bad.status_code < 500


async def test_memories_and_recall_link_back_to_turns(setup: Setup) -> None:
    await seed(setup.memory, "local")
    memories = (await setup.client.get("/inspector/api/users/u-1/memories")).json()["memories"]
    seinen = next(m for m in memories if "seinen" in m["content"])
    assert seinen["provenance"]["session_id"] == "s-1"
    assert seinen["provenance"]["turn_indexes"] == [0]
    hits = (
        await setup.client.get("/inspector/api/users/u-1/recall", params={"q": "seinen"})
    ).json()
    assert hits["hits"][0]["text"]
    assert any(h["session_id"] == "s-1" and h["turn_indexes"] == [0] for h in hits["hits"])
    blank = await setup.client.get("/inspector/api/users/u-1/recall", params={"q": "  "})
    assert 400 <= blank.status_code < 500


def test_tiermem_serve_serves_the_inspector(tmp_path: Path) -> None:
    """A real ``tiermem serve`` process on loopback without keys: the page, and the data of
    the local tenant (what ``tiermem chat`` and ``tiermem mcp`` write)."""
    seeded = MemoryService.from_settings(TierMemSettings(sqlite_path=tmp_path / "t.db"))

    async def write() -> None:
        try:
            await seed(seeded, "local")
        finally:
            await seeded.aclose()

    asyncio.run(write())
    port = free_port()
    process = start_tiermem(["serve", "--port", str(port)], port, tmp_path)
    try:
        base = f"http://127.0.0.1:{port}/inspector"
        page = httpx.get(f"{base}/", timeout=30)
        assert page.status_code == 200
        assert "tiermem inspector" in page.text
        sessions = httpx.get(f"{base}/api/users/u-1/sessions", timeout=30).json()
        assert [s["session_id"] for s in sessions["sessions"]] == ["s-1"]
        KeyStore(tmp_path / "keys.json").create("acme")  # from now on keys are required
        assert httpx.get(f"{base}/api/users/u-1/sessions", timeout=30).status_code == 401
    finally:
        stop(process)
