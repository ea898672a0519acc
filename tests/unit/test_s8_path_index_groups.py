"""The in-process index builds a term's postings-by-value when a search first needs it.

Before, every write kept a set per (term, value) for every term; now only terms a search
asked for have one (``_Groups``), built from the postings then kept up to date. Random
writes, rewrites, removals and expiries interleaved with one- and two-term searches (the
path that reads the groups) must give the hits of the plain reference (score every
document, filter, sort), and every kept group must equal one built afresh from the
postings.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from tiermem.longterm.index import DocKind, IndexedDoc
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.postings import bm25_scores, top_scores
from tiermem.longterm.text import query_terms
from tiermem.testing import FakeClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)
USER = "u-groups"
KINDS: tuple[DocKind, ...] = ("memory", "turn", "chunk")
VOCAB = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]


def _plain(index: InProcessIndex, query: str, kinds: tuple[DocKind, ...], limit: int) -> list:
    user = index._users[USER]
    found = [t for t in query_terms(query) if t in user.postings]
    lists = [(len(user.postings[t]), user.postings[t]) for t in found]
    now = index._clock.now()

    def keep(doc_id: str) -> bool:
        doc = user.docs[doc_id]
        return doc.kind in kinds and not doc.expired(now)

    scores = bm25_scores(lists, len(user.docs), user.total_length / len(user.docs))
    return top_scores(scores, limit, keep)


def _fresh_group(postings: dict[str, int]) -> dict[int, set[str]]:
    by_value: dict[int, set[str]] = {}
    for doc_id, value in postings.items():
        by_value.setdefault(value, set()).add(doc_id)
    return by_value


@pytest.mark.parametrize("seed", range(8))
async def test_searches_and_groups_match_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock(T0)
    index = InProcessIndex(clock=clock)
    ids = [f"d{n}" for n in range(40)]
    for _ in range(400):
        action = rng.random()
        if action < 0.55:
            docs = []
            for doc_id in rng.sample(ids, rng.randint(1, 6)):
                words = [rng.choice(VOCAB) for _ in range(rng.randint(1, 10))]
                expiry = rng.random()
                docs.append(
                    IndexedDoc(
                        user_id=USER,
                        doc_id=doc_id,
                        kind=rng.choice(KINDS),
                        text=" ".join(words),
                        created_at=clock.now(),
                        expires_at=None
                        if expiry < 0.5
                        else clock.now() + timedelta(seconds=rng.randint(-5, 60)),
                    )
                )
            await index.upsert(docs)
        elif action < 0.65:
            await index.remove(USER, rng.sample(ids, rng.randint(1, 4)))
        elif action < 0.75:
            clock.advance(rng.randint(1, 20))
        if not index.has_user(USER) or not index._users[USER].docs:
            continue
        query = " ".join(rng.sample([*VOCAB, "absent"], rng.randint(1, 2)))
        kinds = tuple(rng.sample(KINDS, rng.randint(1, 3)))
        limit = rng.choice([1, 3, 8])
        hits = await index.search(USER, query, kinds=kinds, limit=limit)
        assert [(h.doc_id, h.score) for h in hits] == _plain(index, query, kinds, limit)
        user = index._users[USER]
        for term, group in user.groups.items():
            assert group == _fresh_group(user.postings[term])
        assert set(user.groups) <= set(user.postings)
