"""Tenant isolation over every route: a key of tenant B never reads, writes, lists or
purges anything of tenant A.

The test walks every operation of the app (from its OpenAPI schema, cross-checked against
the router so no route hides) and calls each with B's key on A's ids. Routes on a session
must answer 404 (A's session does not exist for B). Routes on a user act on B's own user of
that name (users exist implicitly; B's "u-1" is not A's): they may answer 2xx, but never
with A's data. Afterwards A's data is checked intact. An unclassified route fails the
test: a new route must say here which kind it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute

from tiermem.service import MemoryService

from .conftest import ClientFactory

SECRET = "zebra-quartz-7731"  # in every piece of A's data; B must never see it
QUERY = "zebra quartz 7731"  # what B searches for: matches A's data, is not the secret

# Bodies of the routes that take one (keyed by path and method). A new route with a body
# fails the test until it is listed here.
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/sessions"): {"user_id": "u-1", "session_id": "s-other"},
    ("POST", "/v1/sessions/{session_id}/turns"): {"role": "user", "content": "B writes"},
    ("POST", "/v1/sessions/{session_id}/context"): {"query": QUERY, "budget": 4000},
    ("PUT", "/v1/sessions/{session_id}/state/{name}"): {"data": {"by": "B"}},
    ("POST", "/v1/users/{user_id}/memories"): {"content": "B's own memory"},
    ("POST", "/v1/users/{user_id}/recall"): {
        "query": QUERY,
        "scope": ["memory", "turn", "chunk"],
    },
    ("POST", "/v1/users/{user_id}/documents"): "multipart",
    ("POST", "/v1/users/{user_id}/documents/text"): {"name": "b.txt", "text": "B's document"},
}
# Tenant-neutral routes: server configuration and process-wide counters (no ids, no content).
NEUTRAL = {"/v1/tools", "/v1/stats", "/metrics", "/inspector/api/tools"}
# Liveness and readiness: no data, no key.
UNAUTHENTICATED = {"/healthz", "/readyz"}
# Routes hidden from the schema: the inspector's static page and assets (no data in them).
HIDDEN_STATIC = {"/inspector/", "/inspector/static/{name}"}


def kind_of(method: str, path: str) -> str:
    """``session``: names a session, so B must get 404 for A's; ``user``: acts on B's own
    user of that name (2xx allowed, never A's data); ``neutral``; ``open``: no key."""
    if path in UNAUTHENTICATED:
        return "open"
    if path in NEUTRAL:
        return "neutral"
    if "{session_id}" in path:
        return "session"
    if "{user_id}" in path or (method, path) == ("POST", "/v1/sessions"):
        return "user"
    raise AssertionError(f"classify the route {method} {path} in this test")


def _operations(app: FastAPI) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in app.openapi()["paths"].items():
        for method, operation in methods.items():
            yield method.upper(), path, operation


def _hidden_routes(routes: list[Any], found: set[str]) -> set[str]:
    for route in routes:
        if isinstance(route, APIRoute) and not route.include_in_schema:
            found.add(route.path)
        inner = getattr(route, "original_router", None)  # an included router
        if inner is not None:
            _hidden_routes(inner.routes, found)  # an APIRouter's paths carry its prefix
    return found


def _query(operation: dict[str, Any]) -> dict[str, Any]:
    """A value for every required query parameter (so the route runs, not a 422)."""
    values: dict[str, Any] = {}
    for param in operation.get("parameters", []):
        if param["in"] == "query" and param.get("required"):
            kind = param["schema"].get("type")
            values[param["name"]] = {"integer": 1, "boolean": False}.get(kind, QUERY)
    return values


async def _seed_tenant_a(client: httpx.AsyncClient, service: MemoryService) -> dict[str, str]:
    async def ok(r: httpx.Response) -> dict[str, Any]:
        assert r.is_success, r.text
        return dict(r.json())

    await ok(await client.post("/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"}))
    for n in range(3):
        await ok(
            await client.post(
                "/v1/sessions/s-1/turns",
                json={"role": "user", "content": f"I prefer seinen {SECRET} number {n}"},
            )
        )
    await ok(await client.put("/v1/sessions/s-1/state/plan", json={"data": {"s": SECRET}}))
    memory = await ok(
        await client.post("/v1/users/u-1/memories", json={"content": f"Code word {SECRET}"})
    )
    document = await ok(
        await client.post(
            "/v1/users/u-1/documents/text", json={"name": "a.md", "text": f"# A\n\n{SECRET}"}
        )
    )
    await service.drain()
    return {
        "session_id": "s-1",
        "user_id": "u-1",
        "index": "0",
        "name": "plan",
        "memory_id": memory["memory_id"],
        "document_id": document["document_id"],
    }


async def _snapshot_of_a(client: httpx.AsyncClient, ids: dict[str, str]) -> list[str]:
    paths = [
        "/v1/sessions/s-1",
        "/v1/sessions/s-1/turns",
        "/v1/sessions/s-1/state/plan",
        f"/v1/users/u-1/memories/{ids['memory_id']}",
        f"/v1/users/u-1/documents/{ids['document_id']}",
        "/v1/users/u-1/sessions",
    ]
    out = []
    for path in paths:
        r = await client.get(path)
        assert r.status_code == 200, (path, r.text)
        body = r.json()
        if path == "/v1/sessions/s-1":  # last_activity and counters move with reads
            body = body["metadata"]["turn_count"], body["metadata"]["closed_at"]
        out.append(repr(body))
    return out


async def _call(
    client: httpx.AsyncClient, method: str, path: str, body: Any, params: dict[str, Any]
) -> httpx.Response:
    if body == "multipart":
        return await client.request(method, path, files={"file": ("b.txt", b"B's upload")})
    return await client.request(method, path, json=body, params=params)


async def test_every_route_refuses_another_tenants_key(
    app: FastAPI,
    client_a: httpx.AsyncClient,
    client_b: httpx.AsyncClient,
    client_for: ClientFactory,
    service: MemoryService,
) -> None:
    operations = list(_operations(app))
    hidden = _hidden_routes(app.routes, set())
    assert hidden <= HIDDEN_STATIC, f"routes hidden from the schema: {hidden}"
    for method, path, operation in operations:
        kind_of(method, path)
        if "requestBody" in operation:
            assert (method, path) in BODIES, f"add a body for {method} {path} to BODIES"
    assert len(operations) >= 28

    ids = await _seed_tenant_a(client_a, service)
    before = await _snapshot_of_a(client_a, ids)
    anonymous = client_for(None)
    tried = 0
    # Purging B's "u-1" last: everything else runs against a tenant B that has data too.
    ordered = sorted(operations, key=lambda o: (o[0], o[1]) == ("DELETE", "/v1/users/{user_id}"))
    for method, template, operation in ordered:
        path = template.format(**ids)
        kind = kind_of(method, template)
        body = BODIES.get((method, template))
        params = _query(operation)
        if kind == "open":
            r = await anonymous.request(method, path)
            assert r.status_code == 200
            assert SECRET not in r.text
            continue
        # Without a key: 401 on every route, before anything is read.
        r = await _call(anonymous, method, path, body, params)
        assert r.status_code == 401, (method, template, r.status_code, r.text)
        r = await _call(client_b, method, path, body, params)
        tried += 1
        where = f"{method} {template}"
        assert r.status_code < 500, (where, r.text)
        assert SECRET not in r.text, f"{where} leaked tenant A's data to B: {r.text}"
        assert "tenant-a" not in r.text, (where, r.text)
        if kind == "session":
            assert r.status_code == 404, (where, r.status_code, r.text)
            assert r.json()["error"]["code"] == "not_found"
        else:
            assert r.status_code in (200, 201, 404), (where, r.status_code, r.text)
    assert tried == len(operations) - len(UNAUTHENTICATED)

    # B's "u-1" only ever saw B's own data ...
    r = await client_b.post("/v1/users/u-1/recall", json={"query": "seinen", "scope": ["turn"]})
    assert r.json()["hits"] == []
    # ... and A's data is exactly as it was.
    assert await _snapshot_of_a(client_a, ids) == before
    r = await client_a.post("/v1/users/u-1/recall", json={"query": SECRET})
    assert r.json()["hits"], "A's memory must still be recalled"


async def test_the_same_ids_in_two_tenants_are_two_users_and_sessions(
    client_a: httpx.AsyncClient, client_b: httpx.AsyncClient, service: MemoryService
) -> None:
    for client, text in ((client_a, "A says hi"), (client_b, "B says hi")):
        r = await client.post("/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"})
        assert r.status_code == 200
        await client.post("/v1/sessions/s-1/turns", json={"role": "user", "content": text})
        await client.post("/v1/users/u-1/memories", json={"content": text})
    for client, text in ((client_a, "A says hi"), (client_b, "B says hi")):
        turns = (await client.get("/v1/sessions/s-1/turns")).json()["turns"]
        assert [t["content"][0]["text"] for t in turns] == [text]
        memories = (await client.get("/v1/users/u-1/memories")).json()["memories"]
        assert [m["content"] for m in memories] == [text]
    # B purges its u-1: A's u-1 keeps everything.
    assert (await client_b.delete("/v1/users/u-1")).status_code == 200
    assert (await client_b.get("/v1/sessions/s-1")).status_code == 404
    assert (await client_a.get("/v1/sessions/s-1")).status_code == 200
    assert len((await client_a.get("/v1/users/u-1/memories")).json()["memories"]) == 1
