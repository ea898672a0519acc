"""The API over the real backend pairings (memory+sqlite, redis+dynamodb, redis+sqlite):
a conversation, an idempotent retry, state compare-and-set, memories, and two tenants with
the same ids. Redis and DynamoDB Local are real servers (scripts/test.sh starts them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import PAIRINGS, open_pairing
from tiermem.interfaces.api import create_app
from tiermem.interfaces.tenancy import KeyStore
from tiermem.settings import TierMemSettings


@pytest.fixture(params=PAIRINGS)
async def clients(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    async with open_pairing(request.param, tmp_path) as pairing:
        service = pairing.service()
        store = KeyStore(tmp_path / "keys.json")
        _, a = store.create("tenant-a")
        _, b = store.create("tenant-b")
        app = create_app(TierMemSettings(), service=service, keystore=store)
        transport = httpx.ASGITransport(app)
        base = "http://testserver"
        async with (
            httpx.AsyncClient(
                transport=transport, base_url=base, headers={"Authorization": f"Bearer {a}"}
            ) as client_a,
            httpx.AsyncClient(
                transport=transport, base_url=base, headers={"Authorization": f"Bearer {b}"}
            ) as client_b,
        ):
            try:
                yield client_a, client_b
            finally:
                await service.drain()
                await service.background.aclose()


async def test_the_api_on_every_pairing(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    a, b = clients
    for client, who in ((a, "A"), (b, "B")):
        r = await client.post("/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"})
        assert r.status_code == 200, r.text
        for n in range(3):
            turn = {"role": "user", "content": f"{who} says hello {n}, I prefer seinen"}
            key = {"Idempotency-Key": f"k-{n}"}
            first = await client.post("/v1/sessions/s-1/turns", json=turn, headers=key)
            retry = await client.post("/v1/sessions/s-1/turns", json=turn, headers=key)
            assert first.status_code == retry.status_code == 201, first.text
            assert first.json()["index"] == retry.json()["index"] == n
        r = await client.put("/v1/sessions/s-1/state/plan", json={"data": {"who": who}})
        assert r.json()["version"] == 1
        r = await client.put(
            "/v1/sessions/s-1/state/plan", json={"data": {"who": who}, "expected_version": 5}
        )
        assert r.status_code == 409
        r = await client.post("/v1/users/u-1/memories", json={"content": f"{who} lives in Osaka"})
        assert r.status_code == 201, r.text

    for client, who in ((a, "A"), (b, "B")):
        turns = (await client.get("/v1/sessions/s-1/turns")).json()["turns"]
        assert [t["content"][0]["text"][0] for t in turns] == [who] * 3
        window = (await client.post("/v1/sessions/s-1/context", json={"budget": 4000})).json()
        assert window["stats"]["total_turns"] == 3
        assert all(i["provenance"]["session_id"] in (None, "s-1") for i in window["items"])
        hits = (await client.post("/v1/users/u-1/recall", json={"query": "Osaka"})).json()
        assert [h["text"] for h in hits["hits"]] == [f"{who} lives in Osaka"]
        assert (await client.get("/v1/sessions/s-1/state/plan")).json()["data"] == {"who": who}

    assert (await b.delete("/v1/users/u-1")).status_code == 200
    assert (await b.get("/v1/sessions/s-1")).status_code == 404
    assert (await a.get("/v1/sessions/s-1")).json()["stats"]["turn_count"] == 3
