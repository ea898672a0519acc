"""The Redis durable store's decoded-turn cache leaves no copy of an erased turn (issue #8
review): a redaction, a session's deletion and a user's purge each empty it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from tests.backends.redis import fresh_prefix
from tests.conftest import server_url
from tiermem.models import SessionRef
from tiermem.store.backends.redis_durable import RedisDurableStore
from tiermem.store.backends.redis_scripts import client_from_url
from tiermem.testing.backend import text_turn


@pytest.mark.parametrize("erase", ["redact", "session", "user"])
async def test_an_erasure_leaves_no_decoded_turn(erase: str) -> None:
    store = RedisDurableStore(client_from_url(server_url("redis")), prefix=fresh_prefix())
    sid, uid = f"s-{uuid.uuid4().hex[:8]}", f"u-{uuid.uuid4().hex[:8]}"
    try:
        await store.register_session(
            SessionRef(session_id=sid, user_id=uid, created_at=datetime.now(UTC))
        )
        await store.append_turns(sid, [text_turn("secret plan")])
        assert [t.text for t in await store.get_turns(sid)] == ["secret plan"]
        assert store._decoded.held_bytes > 0
        if erase == "redact":
            await store.redact_turn(sid, 0)
        elif erase == "session":
            await store.delete_session(sid)
        else:
            await store.purge_user(uid)
        assert store._decoded.held_bytes == 0
        assert all("secret" not in t.text for t in await store.get_turns(sid))
    finally:
        await store.purge_user(uid)
        await store._io.client.aclose()
