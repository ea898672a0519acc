"""Long-term memory through the service, on every pairing: turns → auto-detected memories →
recall (memories, archived turns, document chunks) → user context → GDPR purge.

Plus: each deployment built from settings gets the search index documents/recall.md says.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from tests.conftest import server_url
from tests.integration.conftest import Pairing
from tiermem.longterm.index_memory import InProcessIndex, WarmingIndex
from tiermem.longterm.index_redis import RedisIndex
from tiermem.longterm.index_sqlite import SQLiteIndex
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings


async def test_turns_become_recallable_memories_with_provenance(pairing: Pairing) -> None:
    memory = pairing.service()
    user = f"u-lt-{uuid.uuid4().hex[:8]}"
    session = await memory.session(user_id=user)
    await session.add_turn("user", "Hello! I prefer seinen manga.")
    pref_turn = await session.add_turn("user", "I don't like horror at all.")
    await session.add_turn("assistant", "Noted. Berserk is seinen; shall I check volume 42?")
    await session.add_turn("user", "!remember my copy of volume 41 arrived damaged")
    await memory.drain()

    prefs = await memory.longterm.preferences(user)
    assert {p.metadata.get("preference_key") for p in prefs} >= {"favorite_genre"}
    hits = await memory.longterm.recall(user, "horror", k=3)
    assert hits, "the dislike of horror should be recalled"
    top = hits[0]
    assert top.memory is not None
    assert top.provenance.session_id == session.id
    assert pref_turn.index in top.provenance.turn_indexes

    damaged = await memory.longterm.recall(user, "damaged volume", k=3)
    assert any("damaged" in h.text for h in damaged)
    assert damaged[0].provenance.source == "explicit"

    episodic = await memory.longterm.recall(user, "Berserk volume 42", scope=("turn",), k=3)
    assert episodic[0].kind == "turn"
    assert episodic[0].turn is not None
    assert episodic[0].turn.index == 2
    assert episodic[0].provenance.turn_indexes == (2,)

    context = await memory.longterm.build_user_context(
        user, "what should I read?", budget_tokens=200
    )
    assert "seinen" in context.text
    assert context.tokens <= 200


async def test_knowledge_chunks_are_recalled(pairing: Pairing) -> None:
    memory = pairing.service()
    user = f"u-kb-{uuid.uuid4().hex[:8]}"
    doc = await memory.knowledge.add_document(
        user,
        "returns.md",
        b"# Returns\n\nDamaged volumes can be returned within 30 days for a full refund.\n\n"
        b"# Shipping\n\nOrders ship from the Osaka warehouse.",
    )
    hits = await memory.longterm.recall(user, "refund damaged", scope=("chunk",), k=2)
    assert hits[0].kind == "chunk"
    assert "30 days" in hits[0].text
    assert doc.document_id in hits[0].provenance.memory_ids
    assert await memory.knowledge.delete_document(user, doc.document_id)
    assert await memory.longterm.recall(user, "refund damaged", scope=("chunk",)) == []


async def test_purge_user_leaves_nothing_in_any_tier(pairing: Pairing) -> None:
    memory = pairing.service()
    user, other = f"u-gdpr-{uuid.uuid4().hex[:8]}", f"u-keep-{uuid.uuid4().hex[:8]}"
    ids = {}
    for who in (user, other):
        session = await memory.session(user_id=who)
        await session.add_turn("user", "I prefer seinen. Call me Ken.")
        ids[who] = session.id
    await memory.drain()
    assert await memory.longterm.recall(user, "seinen")

    await memory.purge_user(user)

    assert await pairing.hot.load(ids[user]) is None
    assert await pairing.durable.get_turns(ids[user]) == []
    assert await pairing.durable.list_sessions(user) == []
    assert await pairing.durable.query_memories(user, include_expired=True) == []
    assert await memory.longterm.recall(user, "seinen") == []
    assert await memory.longterm.recall(user, "seinen", scope=("turn",)) == []
    # The other user is untouched.
    assert await pairing.hot.load(ids[other]) is not None
    assert await memory.longterm.recall(other, "seinen")


async def test_each_deployment_gets_its_index(tmp_path: Path) -> None:
    embedded = MemoryService.from_settings(
        TierMemSettings(
            hot_backend="memory", durable_backend="sqlite", sqlite_path=tmp_path / "e.db"
        )
    )
    production = MemoryService.from_settings(
        TierMemSettings(
            hot_backend="redis",
            durable_backend="sqlite",
            redis_url=server_url("redis"),
            redis_prefix=f"t{uuid.uuid4().hex[:6]}",
            sqlite_path=tmp_path / "p.db",
        )
    )
    in_memory = MemoryService.from_settings(
        TierMemSettings(hot_backend="memory", durable_backend="memory")
    )
    try:
        assert isinstance(embedded.longterm.index, SQLiteIndex)
        assert isinstance(production.longterm.index, RedisIndex)
        assert isinstance(in_memory.longterm.index, InProcessIndex)
        for service in (embedded, production, in_memory):
            session = await service.session(user_id="u-deploy")
            await session.add_turn("user", "I prefer seinen")
            await service.drain()
            assert await service.longterm.recall("u-deploy", "seinen")
    finally:
        for service in (embedded, production, in_memory):
            await service.aclose()


async def test_dynamodb_alone_warms_an_in_process_index() -> None:
    from tiermem.store.backends.dynamodb import create_table

    table = f"tiermem-warm-{uuid.uuid4().hex[:6]}"
    endpoint = server_url("dynamodb")
    await create_table(
        table, endpoint_url=endpoint, region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    )
    settings = TierMemSettings(
        hot_backend="memory",
        durable_backend="dynamodb",
        dynamodb_table=table,
        dynamodb_endpoint_url=endpoint,
        aws_region="us-east-1",
    )
    first = MemoryService.from_settings(settings)
    try:
        assert isinstance(first.longterm.index, WarmingIndex)
        await first.longterm.remember("u-warm", "collects first editions of Akira")
    finally:
        await first.aclose()
    # A new process: its index is cold and warms from DynamoDB on the first query.
    second = MemoryService.from_settings(settings)
    try:
        hits = await second.longterm.recall("u-warm", "first editions")
        assert hits
        assert "Akira" in hits[0].text
    finally:
        await second.aclose()
