"""Recall end to end on the durable store + index pairings deployments run.

``memory+in_process`` (in-memory backend), ``sqlite+sqlite`` (embedded default),
``redis+redis``, ``dynamodb+redis`` (production) and ``dynamodb+warming`` (DynamoDB alone,
an in-process index warmed per user). All must return the same hits with the same scores.
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
