"""The REST routes through the real ASGI app on the embedded default."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from tiermem.interfaces.api import create_app
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings
from tiermem.tools import ToolRegistry, ToolSpec
from tiermem.tools.errors import ToolError
from tiermem.tools.invoker import ToolOutput

from .conftest import ClientFactory, Keys


async def _open(client: httpx.AsyncClient, session_id: str = "s-1", user_id: str = "u-1") -> None:
    r = await client.post("/v1/sessions", json={"user_id": user_id, "session_id": session_id})
    assert r.status_code == 200, r.text


async def test_a_conversation_through_the_api(
    client_a: httpx.AsyncClient, service: MemoryService
) -> None:
    await _open(client_a)
    said = [
        ("user", "I prefer seinen. Is Berserk vol 42 in stock?"),
        ("assistant", "Yes, Berserk volume 42 is in stock."),
        ("user", "Great, add it to my cart."),
    ]
    for n, (role, text) in enumerate(said):
        r = await client_a.post(
            "/v1/sessions/s-1/turns",
            json={"role": role, "content": text},
            headers={"Idempotency-Key": f"k-{n}"},
        )
        assert r.status_code == 201, r.text
        assert r.json()["index"] == n
    await service.drain()

    r = await client_a.get("/v1/sessions/s-1/turns/1")
    assert r.json()["content"][0]["text"] == said[1][1]
    r = await client_a.get("/v1/sessions/s-1/turns", params={"start": 1, "end": 3})
    assert [t["index"] for t in r.json()["turns"]] == [1, 2]
    r = await client_a.get("/v1/sessions/s-1/history")
    assert len(r.json()["turns"]) == 3

    r = await client_a.post(
        "/v1/sessions/s-1/context", json={"query": "which genre do I like?", "budget": 2000}
    )
    assert r.status_code == 200, r.text
    window = r.json()
    assert window["stats"]["total_turns"] == 3
    assert window["stats"]["budget_tokens"] == 2000
    assert all(i["provenance"]["session_id"] in (None, "s-1") for i in window["items"])
    assert "seinen" in str(window["system"])

    r = await client_a.get("/v1/sessions/s-1")
    body = r.json()
    assert body["metadata"]["session_id"] == "s-1"
    assert body["metadata"]["user_id"] == "u-1"
    assert body["stats"]["turn_count"] == 3
    r = await client_a.post("/v1/sessions/s-1/close")
    assert r.json()["closed_at"] is not None
    r = await client_a.get("/v1/users/u-1/sessions")
    assert [s["session_id"] for s in r.json()["sessions"]] == ["s-1"]


async def test_ids_are_scoped_inside_the_stores_and_never_shown_scoped(
    client_a: httpx.AsyncClient, service: MemoryService
) -> None:
    await _open(client_a)
    await client_a.post("/v1/sessions/s-1/turns", json={"role": "user", "content": "hello"})
    # Inside the stores the ids carry the tenant prefix ...
    assert await service.tiers.view("s-1") is None
    view = await service.tiers.view("tenant-a:s-1")
    assert view is not None
    assert view.metadata.user_id == "tenant-a:u-1"
    # ... and no answer shows it.
    await service.drain()
    for path in ("/v1/sessions/s-1", "/v1/sessions/s-1/turns", "/v1/users/u-1/sessions"):
        r = await client_a.get(path)
        assert "tenant-a:" not in r.text, path
    r = await client_a.post("/v1/users/u-1/recall", json={"query": "hello", "scope": ["turn"]})
    assert r.json()["hits"], "the turn should be recalled"
    assert "tenant-a:" not in r.text


async def test_summaries_and_recall_in_a_context_name_ids_as_the_caller_knows_them(
    client_a: httpx.AsyncClient, service: MemoryService
) -> None:
    await _open(client_a, "s-0")
    await client_a.post(
        "/v1/sessions/s-0/turns", json={"role": "user", "content": "I live in Osaka"}
    )
    await _open(client_a)
    # Each turn says something new; none supersedes an earlier one (a sentence stating a
    # superseded value is dropped from summaries, which would leave nothing to show).
    for n in range(60):
        text = f"Note {n}: I enjoyed chapter {n} of Berserk and want to read more seinen."
        r = await client_a.post("/v1/sessions/s-1/turns", json={"role": "user", "content": text})
        assert r.status_code == 201
    await service.drain()
    r = await client_a.post(
        "/v1/sessions/s-1/context", json={"query": "where do I live, Osaka?", "budget": 1500}
    )
    assert r.status_code == 200, r.text
    window = r.json()
    assert window["stats"]["summary_active"], "60 turns at 1,500 tokens should summarize"
    summaries = [i for i in window["items"] if i["kind"] == "summary"]
    assert summaries
    assert all(i["provenance"]["summary_id"].startswith("s-1:") for i in summaries)
    at = r.text.find("tenant-a")
    assert at < 0, r.text[max(0, at - 200) : at + 100]


async def test_an_idempotent_retry_returns_the_stored_turn(client_a: httpx.AsyncClient) -> None:
    await _open(client_a)
    sent = {"role": "user", "content": "Order Berserk 42"}
    first = await client_a.post(
        "/v1/sessions/s-1/turns", json=sent, headers={"Idempotency-Key": "order-1"}
    )
    again = await client_a.post(
        "/v1/sessions/s-1/turns", json=sent, headers={"Idempotency-Key": "order-1"}
    )
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    other = await client_a.post(
        "/v1/sessions/s-1/turns", json=sent, headers={"Idempotency-Key": "order-2"}
    )
    assert other.json()["index"] == 1
    r = await client_a.get("/v1/sessions/s-1")
    assert r.json()["stats"]["turn_count"] == 2


async def test_content_blocks_and_options_round_trip(client_a: httpx.AsyncClient) -> None:
    await _open(client_a)
    blocks = [
        {"type": "text", "text": "Checking stock"},
        {"type": "tool_use", "tool_use_id": "t1", "name": "stock", "input": {"isbn": "978-1"}},
    ]
    r = await client_a.post(
        "/v1/sessions/s-1/turns",
        json={"role": "assistant", "content": blocks, "pinned": True, "intent": "stock"},
    )
    assert r.status_code == 201, r.text
    turn = r.json()
    assert turn["pinned"] is True
    assert turn["intent"] == "stock"
    assert [b["type"] for b in turn["content"]] == ["text", "tool_use"]


async def test_state_blobs_are_versioned_compare_and_set(client_a: httpx.AsyncClient) -> None:
    await _open(client_a)
    r = await client_a.get("/v1/sessions/s-1/state/plan")
    assert r.status_code == 404
    r = await client_a.put("/v1/sessions/s-1/state/plan", json={"data": {"step": 1}})
    assert r.json()["version"] == 1
    r = await client_a.put(
        "/v1/sessions/s-1/state/plan", json={"data": {"step": 2}, "expected_version": 1}
    )
    assert r.json()["version"] == 2
    r = await client_a.put(
        "/v1/sessions/s-1/state/plan", json={"data": {"step": 3}, "expected_version": 1}
    )
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "conflict"
    r = await client_a.get("/v1/sessions/s-1/state/plan", params={"fresh": True})
    assert r.json()["data"] == {"step": 2}


async def test_memories_remember_recall_forget_purge(
    client_a: httpx.AsyncClient, service: MemoryService
) -> None:
    r = await client_a.post(
        "/v1/users/u-1/memories", json={"content": "Lives in Osaka", "memory_type": "fact"}
    )
    assert r.status_code == 201, r.text
    memory_id = r.json()["memory_id"]
    assert r.json()["user_id"] == "u-1"
    r = await client_a.post("/v1/users/u-1/recall", json={"query": "Osaka"})
    assert [h["doc_id"] for h in r.json()["hits"]] == [memory_id]
    r = await client_a.get(f"/v1/users/u-1/memories/{memory_id}")
    assert r.json()["content"] == "Lives in Osaka"
    r = await client_a.get("/v1/users/u-1/stats")
    assert r.json()["total"] == 1
    r = await client_a.delete(f"/v1/users/u-1/memories/{memory_id}")
    assert r.json() == {"forgotten": True}
    r = await client_a.get("/v1/users/u-1/memories")
    assert r.json()["memories"] == []

    await _open(client_a)
    await client_a.post("/v1/sessions/s-1/turns", json={"role": "user", "content": "hi"})
    r = await client_a.delete("/v1/users/u-1")
    assert r.status_code == 200
    assert r.json()["deleted"] >= 1
    assert (await client_a.get("/v1/sessions/s-1")).status_code == 404
    assert await service.tiers.durable.get_session("tenant-a:s-1") is None


async def test_documents_upload_as_multipart_or_json(client_a: httpx.AsyncClient) -> None:
    r = await client_a.post(
        "/v1/users/u-1/documents",
        files={"file": ("shipping.md", b"# Shipping\n\nOrders ship within 2 days from Osaka.")},
        data={"tags": ["policy"]},
    )
    assert r.status_code == 201, r.text
    doc = r.json()
    assert (doc["format"], doc["user_id"], doc["tags"]) == ("md", "u-1", ["policy"])
    r = await client_a.post(
        "/v1/users/u-1/documents/text",
        json={"name": "returns.txt", "text": "Returns are accepted within 30 days."},
    )
    assert r.status_code == 201, r.text
    r = await client_a.get("/v1/users/u-1/documents")
    assert {d["name"] for d in r.json()["documents"]} == {"shipping.md", "returns.txt"}
    r = await client_a.post(
        "/v1/users/u-1/recall", json={"query": "how fast do orders ship", "scope": ["chunk"]}
    )
    assert "2 days" in r.json()["hits"][0]["text"]
    r = await client_a.delete(f"/v1/users/u-1/documents/{doc['document_id']}")
    assert r.json() == {"deleted": True}
    assert (await client_a.get(f"/v1/users/u-1/documents/{doc['document_id']}")).status_code == 404


async def test_tools_report_breaker_state(
    settings: TierMemSettings, service: MemoryService, keys: Keys, client_for: ClientFactory
) -> None:
    class Failing:
        async def invoke(self, name: str, arguments: dict[str, object], **kw: object) -> object:
            return ToolOutput.of_text(f"no stock for {arguments}", is_error=True)

    registry = ToolRegistry()
    registry.register(ToolSpec(name="stock", description="Stock lookup"), Failing())  # type: ignore[arg-type]
    app = create_app(settings, service=service, keystore=keys.store, tools=registry)
    client = client_for(keys.a, target=app)
    r = await client.get("/v1/tools")
    assert r.status_code == 200, r.text
    (tool,) = r.json()["tools"]
    assert (tool["name"], tool["breaker"], tool["health"]) == ("stock", "closed", "healthy")
    r = await client.get("/metrics")
    assert 'tiermem_breaker_state{state="closed",tool="stock"} 1.0' in r.text

    # A failure whose error text quotes a caller's data: breakers are shared by every
    # tenant, so the text must not reach another tenant through /v1/tools.
    dispatcher = app.state.tiermem.dispatcher
    for _ in range(3):
        with pytest.raises(ToolError):
            await dispatcher.call("stock", {"isbn": "secret-isbn-of-tenant-a"})
    (tool,) = (await client_for(keys.b, target=app).get("/v1/tools")).json()["tools"]
    assert tool["health"] != "healthy"
    assert tool["message"]
    assert "secret-isbn" not in str(tool)


async def test_metrics_count_operations_hits_and_prefix_changes(
    client_a: httpx.AsyncClient,
) -> None:
    await _open(client_a)
    await client_a.post("/v1/sessions/s-1/turns", json={"role": "user", "content": "hi"})
    body = {"budget": 2000, "system": "You are a manga shop assistant."}
    await client_a.post("/v1/sessions/s-1/context", json=body)
    await client_a.post("/v1/sessions/s-1/context", json=body)
    await client_a.post("/v1/sessions/s-1/context", json={**body, "system": "Changed prompt."})
    r = await client_a.get("/metrics")
    assert r.status_code == 200
    text = r.text
    assert (
        'tiermem_request_duration_seconds_count{operation="/v1/sessions/{session_id}/context",'
        'status="200"} 3.0' in text
    )
    assert 'tiermem_cacheable_prefix_changes_total{cache_point="static"} 1.0' in text
    assert "tiermem_hot_hits_total" in text
    assert "tiermem_summarization_passes_total 0.0" in text


async def test_health_readiness_and_openapi(app: FastAPI, client_for: ClientFactory) -> None:
    anonymous = client_for(None)
    assert (await anonymous.get("/healthz")).json() == {"status": "ok"}
    r = await anonymous.get("/readyz")
    assert r.json() == {"status": "ready", "backends": {"hot": "ok", "durable": "ok"}}
    schema = (await anonymous.get("/openapi.json")).json()
    add_turn = schema["paths"]["/v1/sessions/{session_id}/turns"]["post"]
    assert add_turn["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "TurnRequest"
    )
    assert add_turn["responses"]["201"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "Turn"
    )
    assert any(p["name"] == "Idempotency-Key" for p in add_turn["parameters"])
    assert "ContextWindow" in schema["components"]["schemas"]


async def test_metrics_read_the_services_summarization_counters(
    client_a: httpx.AsyncClient, service: MemoryService
) -> None:
    text = (await client_a.get("/metrics")).text
    assert "tiermem_summarization_passes_total 0.0" in text
    assert "tiermem_summary_fact_preservation" not in text  # no pass measured yet
    # The summary jobs' own counters, as passes would leave them.
    stats = service.summaries.stats
    stats.committed, stats.failures = 3, 1
    stats.preservation_sum, stats.preservation_passes = 1.8, 2
    text = (await client_a.get("/metrics")).text
    assert "tiermem_summarization_passes_total 3.0" in text
    assert "tiermem_summarization_failures_total 1.0" in text
    assert "tiermem_summary_fact_preservation 0.9" in text


async def test_a_block_whose_type_is_not_a_string_is_kept_as_unknown(
    client_a: httpx.AsyncClient,
) -> None:
    # Found by schemathesis: {"type": {...}} crashed the block discriminator (a 500).
    await _open(client_a)
    r = await client_a.post(
        "/v1/sessions/s-1/turns", json={"role": "user", "content": [{"type": {"a": 1}}]}
    )
    assert r.status_code == 201, r.text
    assert r.json()["content"][0]["type"] == "unknown"


async def test_every_v1_route_publishes_typed_models(client_for: ClientFactory) -> None:
    schema = (await client_for(None).get("/openapi.json")).json()
    untyped = []
    for path, operations in schema["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                body = response.get("content", {}).get("application/json", {})
                if status.startswith(("2", "4", "5")) and not body.get("schema"):
                    untyped.append((method, path, status))
            request = operation.get("requestBody", {}).get("content", {})
            if request and not any(v.get("schema") for v in request.values()):
                untyped.append((method, path, "request"))
    assert untyped == []
    assert (await client_for(None).get("/docs")).status_code == 404  # no CDN-backed pages


async def test_a_users_own_text_that_contains_the_prefix_is_left_alone(
    client_a: httpx.AsyncClient,
) -> None:
    await _open(client_a)
    text = "my notes say tenant-a:u-1 and tenant-a: twice"
    r = await client_a.post("/v1/sessions/s-1/turns", json={"role": "user", "content": text})
    assert r.json()["content"][0]["text"] == text
    assert (await client_a.get("/v1/sessions/s-1/turns/0")).json()["content"][0]["text"] == text
