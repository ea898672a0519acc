"""Bad requests the REST API used to accept or answer unhelpfully (session 14's audit):
each is now a 422 naming the field, and nothing stored changes.

Before: an unknown query parameter was ignored (``?since=...`` on the memory list answered
every memory; ``?types=`` for ``?memory_type=`` too), an unknown memory type in a filter
answered an empty list, a blank recall query ranked every memory by recency,
``recall_k: 0`` failed inside with "ContextRecallPolicy needs k >= 1" and no field, and
``budget: true`` / ``"4000"`` were taken as 1 and 4000 (the first then failed as
"budget_exceeded")."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

CASES: list[tuple[str, str, str, dict[str, Any] | None, str, str]] = [
    (
        "list memories ?since=",
        "get",
        "/v1/users/u-1/memories?since=yesterday",
        None,
        "since",
        "unknown query parameter 'since'; this route takes include_superseded, limit, memory_type",
    ),
    (
        "list memories ?types= (for memory_type)",
        "get",
        "/v1/users/u-1/memories?types=fact",
        None,
        "types",
        "unknown query parameter 'types'",
    ),
    (
        "get turns ?stat= (for start)",
        "get",
        "/v1/sessions/s-1/turns?stat=1",
        None,
        "stat",
        "unknown query parameter 'stat'; this route takes end, start",
    ),
    (
        "list memories of an unknown type",
        "get",
        "/v1/users/u-1/memories?memory_type=prefrence",
        None,
        "memory_type",
        "unknown memory type 'prefrence'; known: ",
    ),
    (
        "recall of an unknown type",
        "post",
        "/v1/users/u-1/recall",
        {"query": "manga", "types": ["prefrence"]},
        "types",
        "unknown memory type 'prefrence'",
    ),
    (
        "recall with a blank query",
        "post",
        "/v1/users/u-1/recall",
        {"query": "   "},
        "query",
        "query is blank",
    ),
    (
        "recall k='5'",
        "post",
        "/v1/users/u-1/recall",
        {"query": "manga", "k": "5"},
        "k",
        "valid integer",
    ),
    (
        "context recall_k=0",
        "post",
        "/v1/sessions/s-1/context",
        {"budget": 4000, "query": "vol 42", "recall_k": 0},
        "recall_k",
        "greater than or equal to 1",
    ),
    (
        "context budget=true",
        "post",
        "/v1/sessions/s-1/context",
        {"budget": True},
        "budget",
        "valid integer",
    ),
    (
        "context budget='4000'",
        "post",
        "/v1/sessions/s-1/context",
        {"budget": "4000"},
        "budget",
        "valid integer",
    ),
    (
        "context tool named ''",
        "post",
        "/v1/sessions/s-1/context",
        {"budget": 4000, "tools": [{"name": ""}]},
        "tools.0.name",
        "at least 1 character",
    ),
]


async def _stored(client: httpx.AsyncClient) -> tuple[Any, ...]:
    turns = await client.get("/v1/sessions/s-1/turns")
    memories = await client.get("/v1/users/u-1/memories")
    assert turns.status_code == 200
    assert memories.status_code == 200
    return turns.json(), memories.json()


@pytest.mark.parametrize(
    ("label", "method", "url", "body", "field", "message"), CASES, ids=[c[0] for c in CASES]
)
async def test_a_bad_request_is_422_naming_the_field_and_changes_nothing(
    client_a: httpx.AsyncClient,
    label: str,
    method: str,
    url: str,
    body: dict[str, Any] | None,
    field: str,
    message: str,
) -> None:
    opened = await client_a.post("/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"})
    assert opened.status_code == 200, opened.text
    added = await client_a.post(
        "/v1/sessions/s-1/turns", json={"role": "user", "content": "Is vol 42 in stock?"}
    )
    assert added.status_code == 201, added.text
    remembered = await client_a.post(
        "/v1/users/u-1/memories", json={"content": "I like seinen", "memory_type": "preference"}
    )
    assert remembered.status_code == 201, remembered.text
    before = await _stored(client_a)

    response = await client_a.request(method.upper(), url, json=body)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field
    assert message in error["message"]
    assert await _stored(client_a) == before


async def test_known_query_parameters_and_types_still_work(client_a: httpx.AsyncClient) -> None:
    await client_a.post(
        "/v1/users/u-1/memories", json={"content": "I like seinen", "memory_type": "preference"}
    )
    listed = await client_a.get(
        "/v1/users/u-1/memories?limit=5&include_superseded=true&memory_type=preference"
    )
    assert listed.status_code == 200, listed.text
    assert [m["content"] for m in listed.json()["memories"]] == ["I like seinen"]
    recalled = await client_a.post(
        "/v1/users/u-1/recall", json={"query": "seinen", "types": ["preference"], "k": 3}
    )
    assert recalled.status_code == 200, recalled.text
    assert recalled.json()["hits"]
