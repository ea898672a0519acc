"""numpy BM25 of the in-process index (:func:`tiermem.longterm.postings.bm25_top_dense`):
on random corpora, writes, rewrites, removals and expiry, queries of three or more terms
return exactly what the reference scoring (:func:`bm25_scores` + :func:`top_scores`) and
the pure-Python :func:`bm25_top` return: same ids, same order (ties by id), same floats."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from tiermem.clock import FakeClock
from tiermem.longterm.index import DocKind, IndexedDoc
from tiermem.longterm.index_memory import DENSE_TERMS, InProcessIndex
from tiermem.longterm.postings import HAS_NUMPY, bm25_scores, bm25_top, top_scores
from tiermem.longterm.text import query_terms

pytestmark = pytest.mark.skipif(not HAS_NUMPY, reason="the dense path needs numpy")

T0 = datetime(2026, 1, 1, tzinfo=UTC)
USER = "u1"
KINDS: tuple[DocKind, ...] = ("memory", "turn", "chunk")


def reference(
    index: InProcessIndex, query: str, kinds: tuple[DocKind, ...], limit: int, now: datetime
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """The plain top (score everything, then filter and sort) and :func:`bm25_top`'s."""
    user = index._users[USER]
    found = [term for term in query_terms(query) if term in user.postings]
    lists = [(len(user.postings[t]), user.postings[t]) for t in found]
    count = len(user.docs)
    average = user.total_length / count

    def keep(doc_id: str) -> bool:
        doc = user.docs[doc_id]
        return doc.kind in kinds and not doc.expired(now)

    plain = top_scores(bm25_scores(lists, count, average), limit, keep)
    pruned = bm25_top(lists, count, average, limit, keep, [user.groups[t] for t in found])
    return plain, pruned


def random_doc(rng: random.Random, vocab: list[str], doc_id: str, now: datetime) -> IndexedDoc:
    words = [rng.choice(vocab) for _ in range(rng.randint(1, 12))]
    expiry = rng.random()
    return IndexedDoc(
        user_id=USER,
        doc_id=doc_id,
        kind=rng.choice(KINDS),
        text=" ".join(words),
        created_at=now,
        expires_at=None if expiry < 0.7 else now + timedelta(seconds=rng.randint(1, 50)),
    )


@pytest.mark.parametrize("seed", range(12))
async def test_dense_equals_reference_through_writes(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock(T0)
    index = InProcessIndex(clock=clock)
    # A small vocabulary: every term about equally common, and many tied scores.
    vocab = [f"w{n}" for n in range(rng.randint(4, 14))]
    docs = [random_doc(rng, vocab, f"d{n:03d}", T0) for n in range(rng.randint(30, 150))]
    await index.upsert(docs)
    dense_queries = 0
    for step in range(60):
        action = rng.random()
        if action < 0.3:  # new documents (appended to cached dense lists)
            start = rng.randint(0, 10_000)
            await index.upsert(
                [random_doc(rng, vocab, f"n{start + k}", clock.now()) for k in range(3)]
            )
        elif action < 0.45:  # rewrites of existing ids
            await index.upsert([random_doc(rng, vocab, rng.choice(docs).doc_id, clock.now())])
        elif action < 0.55:
            await index.remove(USER, [rng.choice(docs).doc_id])
        elif action < 0.65:
            clock.advance(rng.randint(1, 10))
        if not index.has_user(USER):
            await index.upsert(docs[:5])
        query = " ".join(rng.sample([*vocab, "absent"], rng.randint(1, min(6, len(vocab)))))
        kinds = tuple(rng.sample(KINDS, rng.randint(1, 3)))
        limit = rng.choice([1, 3, 8, 24])
        got = await index.search(USER, query, kinds=kinds, limit=limit)
        plain, pruned = reference(index, query, kinds, limit, clock.now())
        assert [(hit.doc_id, hit.score) for hit in got] == plain, (step, query)
        assert pruned == plain
        user = index._users[USER]
        if sum(term in user.postings for term in query_terms(query)) >= DENSE_TERMS:
            dense_queries += 1
    assert dense_queries > 0  # the numpy path ran (the seeds make broad queries)
    assert index._users[USER].dense_cache  # and kept lists for the next query


async def test_dense_survives_renumbering() -> None:
    """Rewrites leave slots behind; past a threshold the user's slots are renumbered and
    the dense lists rebuilt, with the same results."""
    rng = random.Random(99)
    clock = FakeClock(T0)
    index = InProcessIndex(clock=clock)
    vocab = ["alpha", "beta", "gamma", "delta", "eps"]
    ids = [f"d{n}" for n in range(20)]
    query = "alpha beta gamma delta"
    for round_ in range(120):
        await index.upsert([random_doc(rng, vocab, doc_id, clock.now()) for doc_id in ids])
        got = await index.search(USER, query, kinds=KINDS, limit=5)
        plain, _ = reference(index, query, KINDS, 5, clock.now())
        assert [(hit.doc_id, hit.score) for hit in got] == plain, round_
    user = index._users[USER]
    assert len(user.keys) < 2 * len(user.docs) + 1024 + len(ids)  # holes were reclaimed
    assert all(user.keys[slot] == doc_id for doc_id, slot in user.slots.items())
