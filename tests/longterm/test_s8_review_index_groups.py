"""Review of the lazily built by-value posting groups (commit 7c8b30a): once a search built
a term's group, documents that then expire and are collected, are erased (removed), are
rewritten (a redaction is a rewrite of the same id), or go with their user's erasure must
leave searches giving what an index built afresh from the live documents gives."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from tiermem.longterm.index import DocKind, IndexedDoc
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.testing import FakeClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)
USER = "u-review"
KINDS: tuple[DocKind, ...] = ("memory", "turn")
VOCAB = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]


async def _fresh_hits(
    clock: FakeClock, live: dict[str, IndexedDoc], query: str, limit: int
) -> list[tuple[str, float]]:
    fresh = InProcessIndex(clock=clock)
    if live:
        await fresh.upsert(sorted(live.values(), key=lambda doc: doc.doc_id))
    hits = await fresh.search(USER, query, kinds=KINDS, limit=limit)
    return [(hit.doc_id, hit.score) for hit in hits]


@pytest.mark.parametrize("seed", range(6))
async def test_groups_built_then_expired_erased_redacted_or_purged(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock(T0)
    index = InProcessIndex(clock=clock)
    live: dict[str, IndexedDoc] = {}
    ids = [f"d{n}" for n in range(30)]
    for _ in range(250):
        action = rng.random()
        if action < 0.5:
            docs = []
            for doc_id in rng.sample(ids, rng.randint(1, 5)):
                redacted = rng.random() < 0.15
                text = "redacted" if redacted else " ".join(rng.choices(VOCAB, k=rng.randint(1, 8)))
                expires = None if rng.random() < 0.5 else clock.now() + timedelta(seconds=30)
                docs.append(
                    IndexedDoc(
                        user_id=USER,
                        doc_id=doc_id,
                        kind=rng.choice(KINDS),
                        text=text,
                        created_at=clock.now(),
                        expires_at=expires,
                    )
                )
            await index.upsert(docs)
            live.update((doc.doc_id, doc) for doc in docs)
        elif action < 0.6:
            gone = rng.sample(ids, rng.randint(1, 6))
            await index.remove(USER, gone)
            for doc_id in gone:
                live.pop(doc_id, None)
        elif action < 0.75:
            clock.advance(rng.randint(5, 40))
            await index.collect_expired()
            now = clock.now()
            live = {k: d for k, d in live.items() if d.expires_at is None or d.expires_at > now}
        elif action < 0.78:
            await index.purge_user(USER)
            live.clear()
        query = " ".join(rng.sample(VOCAB, rng.randint(1, 2)))
        limit = rng.choice([1, 4, 10])
        hits = await index.search(USER, query, kinds=KINDS, limit=limit)
        assert [(h.doc_id, h.score) for h in hits] == await _fresh_hits(clock, live, query, limit)
