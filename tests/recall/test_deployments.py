"""Recall end to end on the durable store + index pairings deployments run.

``memory+in_process`` (in-memory backend), ``sqlite+sqlite`` (embedded default),
``redis+redis``, ``dynamodb+redis`` (production), their Redis Cluster twins
``redis-cluster+redis-cluster`` and ``dynamodb+redis-cluster`` (3 masters), and
``dynamodb+warming`` (DynamoDB alone, an in-process index warmed per user). All must return
the same hits with the same scores.

On the cluster the index shares the durable store's key prefix, as the composition root
builds it, so a user's index keys sit in the slot of the user's memories.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import open_backend, server_url
from tests.recall.conftest import T0, days, memory
from tiermem.clock import FakeClock
from tiermem.longterm.index import SearchIndex
from tiermem.longterm.index_memory import InProcessIndex, WarmingIndex
from tiermem.longterm.recall import Recaller, memory_doc, memory_loader, turn_docs, turn_loader
from tiermem.models import SessionRef
from tiermem.store.contract import DurableStore
from tiermem.testing.backend import text_turn

PAIRINGS = [
    "memory+in_process",
    "sqlite+sqlite",
    "redis+redis",
    "dynamodb+redis",
    "redis-cluster+redis-cluster",
    "dynamodb+redis-cluster",
    "dynamodb+warming",
]


@dataclass
class Deployment:
    durable: DurableStore
    index: SearchIndex
    clock: FakeClock


@pytest.fixture(params=PAIRINGS)
async def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Deployment]:
    durable_name, index_name = request.param.split("+")
    clock = FakeClock(T0)
    pair = await open_backend(durable_name, clock, tmp_path)
    await pair.hot.aclose()
    index: SearchIndex
    if index_name == "in_process":
        index = InProcessIndex()
    elif index_name == "sqlite":
        from tiermem.longterm.index_sqlite import SQLiteIndex

        index = SQLiteIndex(tmp_path / "tiermem.db")
    elif index_name == "redis":
        from tests.backends.redis import fresh_prefix
        from tiermem.longterm.index_redis import RedisIndex

        index = RedisIndex.from_url(server_url("redis"), prefix=fresh_prefix())
    elif index_name == "redis-cluster":
        from tests.backends.redis import fresh_prefix
        from tiermem.longterm.index_redis import RedisIndex
        from tiermem.store.backends.redis import RedisDurableStore

        prefix = (
            pair.durable.keys.prefix
            if isinstance(pair.durable, RedisDurableStore)
            else fresh_prefix()
        )
        index = RedisIndex.from_url(server_url("redis-cluster"), prefix=prefix, cluster=True)
    else:
        index = WarmingIndex([memory_loader(pair.durable), turn_loader(pair.durable)])
    try:
        yield Deployment(pair.durable, index, clock)
    finally:
        await index.aclose()
        await pair.durable.aclose()


async def test_recall_is_the_same_on_every_deployment(deployment: Deployment) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    session = f"s-{uuid.uuid4().hex[:8]}"
    records = [
        memory(
            "m1",
            "Prefers seinen manga such as Berserk",
            user_id=user,
            importance=0.9,
            created_at=T0 - days(40),
        ),
        memory(
            "m2",
            "Berserk volume 41 arrived damaged",
            user_id=user,
            memory_type="feedback",
            importance=0.7,
            created_at=T0 - days(3),
        ),
        memory("m3", "ホラー漫画は苦手", user_id=user, created_at=T0 - days(1)),
        memory(
            "m4",
            "Old address in Kyoto",
            user_id=user,
            memory_type="fact",
            invalid_from=T0 - days(1),
        ),
        memory("m5", "Berserk box set expires", user_id=user, expires_at=T0 + days(1)),
    ]
    for record in records:
        await deployment.durable.put_memory(record)
    await deployment.durable.register_session(
        SessionRef(session_id=session, user_id=user, created_at=T0)
    )
    turns = await deployment.durable.append_turns(
        session,
        [
            text_turn("Is Berserk volume 42 out yet?", at=T0 - days(2)),
            text_turn("漫画の配送はいつですか", at=T0 - days(2)),
        ],
    )
    await deployment.index.upsert([memory_doc(r) for r in records])
    await deployment.index.upsert(turn_docs(user, session, turns))

    recaller = Recaller(deployment.durable, deployment.index, clock=deployment.clock)
    hits = await recaller.recall(user, "berserk volume", scope=("memory", "turn"), k=5)
    assert [h.doc_id for h in hits] == ["m2", f"{session}#0", "m5", "m1"]
    # Turn documents carry date terms (their day, week and month), which count in their
    # length and the user's average: hence the turn's lower BM25 than its text alone gives.
    assert [h.score for h in hits] == pytest.approx(
        [0.6133033, 0.5164414, 0.3103147, 0.2899997], abs=1e-6
    )
    assert hits[1].provenance.turn_indexes == (0,)
    assert hits[1].session_id == session

    japanese = await recaller.recall(user, "漫画", scope=("memory", "turn"), k=5)
    assert [h.doc_id for h in japanese] == ["m3", f"{session}#1"]
    assert await recaller.recall(user, "kyoto address") == []  # superseded
    deployment.clock.advance(days(2))
    assert [h.doc_id for h in await recaller.recall(user, "box set")] == []  # expired
    await recaller.aclose()


async def test_a_users_keys_sit_in_one_slot_of_the_cluster(tmp_path: Path) -> None:
    """Every key the store and the index write for one user (memories, sessions, the
    index's documents, statistics, expiries and posting lists of every kind) is in one
    slot: found by listing every master's keys, not by rebuilding their names (so the
    check holds whatever the index's layout). The id carries braces and a ':' that
    escaping must keep from ending the hash tag early."""
    from redis.asyncio.cluster import RedisCluster

    from tiermem.longterm.index import IndexedDoc
    from tiermem.longterm.index_redis import RedisIndex
    from tiermem.store.backends.redis import RedisDurableStore
    from tiermem.store.keys import escape_segment

    clock = FakeClock(T0)
    pair = await open_backend("redis-cluster", clock, tmp_path)
    await pair.hot.aclose()
    durable = pair.durable
    assert isinstance(durable, RedisDurableStore)
    prefix = durable.keys.prefix
    index = RedisIndex.from_url(server_url("redis-cluster"), prefix=prefix, cluster=True)
    user = f"u:{{tag}}-{uuid.uuid4().hex[:8]}"
    session = f"s-{uuid.uuid4().hex[:8]}"
    try:
        # One rare word per document kind, to find its posting list(s) by name below.
        records = [
            memory("m1", "Prefers zanzibar manga", user_id=user),
            memory("m2", "Lives in Osaka", user_id=user, memory_type="fact"),
        ]
        for record in records:
            await durable.put_memory(record)
        await durable.register_session(SessionRef(session_id=session, user_id=user, created_at=T0))
        turns = await durable.append_turns(session, [text_turn("Any quokka books?", at=T0)])
        chunk = IndexedDoc(
            user_id=user,
            doc_id="doc1#0",
            kind="chunk",
            text="Xylophone returns within 30 days",
            created_at=T0,
            expires_at=T0 + days(1),
        )
        await index.upsert([*(memory_doc(r) for r in records), *turn_docs(user, session, turns)])
        await index.upsert([chunk])

        admin = index._io.client
        assert isinstance(admin, RedisCluster)
        tag = f"{{u={escape_segment(user)}}}".encode()
        by_node: dict[str, list[bytes]] = {}
        for node in admin.get_primaries():
            found = await admin.execute_command("KEYS", f"{prefix}:*", target_nodes=node)
            mine = [k for k in found if tag in k]
            if mine:
                by_node[node.name] = mine
        assert len(by_node) == 1, f"the user's keys are spread over masters: {by_node}"
        user_keys = next(iter(by_node.values()))
        parts = [k.split(tag + b":", 1)[1] for k in user_keys]
        index_parts = [p for p in parts if p.startswith(b"ix")]
        assert {b"mem", b"sessions"} <= set(parts)
        for word in (b"zanzibar", b"quokka", b"xylophone"):  # memory, turn, chunk postings
            assert any(word in p for p in index_parts), (word, index_parts)
        slots = {int(await admin.execute_command("CLUSTER KEYSLOT", k)) for k in user_keys}
        assert len(slots) == 1
        # One '{' per key: the escaped id's braces cannot open or close a tag of their own.
        assert all(k.count(b"{") == 1 for k in user_keys)
    finally:
        await durable.purge_user(user)
        await index.purge_user(user)
        await index.aclose()
        await durable.aclose()
