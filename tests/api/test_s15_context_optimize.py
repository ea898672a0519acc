"""POST /v1/sessions/{id}/context takes ``optimize`` (default true), as Session.context
does: a seen, superseded tool output is sent as a reference to its archived turn unless
the request says ``"optimize": false``. A non-boolean is a 422 naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx


def _status(state: str) -> str:
    events = [{"at": f"2026-03-0{day}T09:00:00Z", "event": f"scan {day}"} for day in range(1, 9)]
    return json.dumps({"order": "A-1", "status": state, "events": events})  # over 512 bytes


def _call(tool_use_id: str) -> list[dict[str, Any]]:
    return [
        {"type": "tool_use", "tool_use_id": tool_use_id, "name": "order_status",
         "input": {"order": "A-1"}},
    ]  # fmt: skip


def _result(tool_use_id: str, text: str) -> list[dict[str, Any]]:
    return [
        {"type": "tool_result", "tool_use_id": tool_use_id, "status": "success",
         "content": [{"type": "text", "text": text}]},
    ]  # fmt: skip


async def test_context_optimizes_by_default_and_on_request_not(
    client_a: httpx.AsyncClient,
) -> None:
    opened = await client_a.post("/v1/sessions", json={"user_id": "u-1", "session_id": "s-1"})
    assert opened.status_code == 200, opened.text
    turns: list[tuple[str, Any]] = [
        ("user", "Where is my order A-1?"),
        ("assistant", _call("t1")),
        ("user", _result("t1", _status("in transit"))),
        ("assistant", "It is in transit."),
        ("user", "And now?"),
        ("assistant", _call("t2")),
        ("user", _result("t2", _status("delivered"))),
        ("assistant", "It was delivered."),
    ]
    for role, content in turns:
        added = await client_a.post(
            "/v1/sessions/s-1/turns", json={"role": role, "content": content}
        )
        assert added.status_code == 201, added.text

    def texts(window: dict[str, Any]) -> str:
        return json.dumps(window["messages"])

    default = await client_a.post("/v1/sessions/s-1/context", json={"budget": 8000})
    assert default.status_code == 200, default.text
    assert "retrievable with session.get_turn(2)" in texts(default.json())
    # The old reading is a reference; the final result stays verbatim.
    assert texts(default.json()).count("scan 1") == 1
    assert default.json()["stats"]["optimization"]["tokens_saved"] > 0

    plain = await client_a.post(
        "/v1/sessions/s-1/context", json={"budget": 8000, "optimize": False}
    )
    assert plain.status_code == 200, plain.text
    assert texts(plain.json()).count("scan 1") == 2
    assert "get_turn(2)" not in texts(plain.json())

    bad = await client_a.post("/v1/sessions/s-1/context", json={"optimize": "no"})
    assert bad.status_code == 422, bad.text
    assert bad.json()["error"]["field"] == "optimize"
