"""The Redis index's upsert script writes exactly layout 2, byte for byte.

The client packs each document's posting values and joins its terms, and the script only
appends them (issue #8: per-term work in Lua cost Redis more than the APPENDs). These tests
rebuild, in Python, what layout 2 defines for the same documents (numbers in write order,
``length * 2^20 + tf`` values, the docs, terms and ids hashes, the statistics, the expiry
set) and compare every key; then they replace and remove documents, which read back the
terms the upsert stored, and compare search with the in-process index. Real Redis and the
real cluster (``TIERMEM_TEST_REDIS_URL``, ``TIERMEM_TEST_REDIS_CLUSTER_URL``).
"""

from __future__ import annotations

import random
import struct
from collections.abc import AsyncIterator

import pytest

from tests.conftest import server_url
from tests.recall.conftest import T0, days, doc
from tiermem.longterm.index import DocKind, IndexedDoc, terms_of
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.index_redis import RedisIndex
from tiermem.longterm.postings import POSTING_SHIFT, unpack_postings
from tiermem.store.backends.redis_scripts import to_us
from tiermem.testing import FakeClock

KINDS: tuple[DocKind, ...] = ("memory", "turn", "chunk")
WORDS = [f"w{i}" for i in range(12)] + ["berserk", "guts", "ホラー", "好き", "dt20300101"]


@pytest.fixture(params=["redis", "redis-cluster"])
async def index(request: pytest.FixtureRequest) -> AsyncIterator[RedisIndex]:
    from tests.backends.redis import fresh_prefix

    backend = request.param
    url = server_url(backend)
    opened = RedisIndex.from_url(
        url, prefix=fresh_prefix(), clock=FakeClock(T0), cluster=backend == "redis-cluster"
    )
    try:
        yield opened
    finally:
        await opened.aclose()


def _batch(rng: random.Random, ids: range) -> list[IndexedDoc]:
    """Documents with shared and repeated terms (tf > 1), CJK terms, some expiring, one
    already expired, and one id named twice (the last version wins)."""
    docs = []
    for i in ids:
        kind = rng.choice(KINDS)
        expires = None
        if kind == "turn":
            expires = T0 + days(rng.choice((-1, 2, 30)))
        text = " ".join(rng.choices(WORDS, k=rng.randint(1, 12)))
        docs.append(doc(f"d{i}", text, kind=kind, expires_at=expires))
    docs.append(doc(f"d{ids[0]}", "berserk berserk guts", kind="memory"))
    return docs


def _layout(batches: list[list[IndexedDoc]]) -> dict[str, object]:
    """What layout 2 holds after these upserts of new documents on a fresh user."""
    now = T0
    docs: dict[str, str] = {}
    terms: dict[str, str] = {}
    ids: dict[str, str] = {}
    exp: dict[str, float] = {}
    lists: dict[tuple[str, str], tuple[bytearray, bytearray]] = {}
    number = total = 0
    for batch in batches:
        latest: dict[str, IndexedDoc] = {}
        for d in batch:
            latest.pop(d.doc_id, None)
            latest[d.doc_id] = d
        for d in latest.values():
            if d.expires_at is not None and d.expires_at <= now:
                continue
            number += 1
            counts = terms_of(d)
            length = sum(counts.values())
            total += length
            docs[d.doc_id] = f"{d.kind}|{length}|{number}"
            terms[d.doc_id] = " ".join(counts)
            ids[str(number)] = d.kind[0] + d.doc_id
            if d.expires_at is not None:
                exp[d.doc_id] = float(to_us(d.expires_at))
            for term, tf in counts.items():
                n, v = lists.setdefault((d.kind[0], term), (bytearray(), bytearray()))
                n += struct.pack("<I", number)
                v += struct.pack("<Q", length * POSTING_SHIFT + tf)
    return {
        "docs": docs,
        "terms": terms,
        "ids": ids,
        "exp": exp,
        "stats": {"n": str(len(docs)), "len": str(total), "next": str(number)},
        "lists": {key: (bytes(n), bytes(v)) for key, (n, v) in lists.items()},
    }


async def _stored(
    index: RedisIndex, user_id: str, lists: list[tuple[str, str]]
) -> dict[str, object]:
    client = index._io.client
    docs_key, terms_key, stats_key, exp_key = index.keys.index(user_id)

    def text(raw: dict[bytes, bytes]) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in raw.items()}

    stats = text(await client.hgetall(stats_key))
    stats.pop("epoch")
    kind_of = {k[0]: k for k in KINDS}
    stored_lists = {}
    for k, term in lists:
        n_key, v_key = index.keys.posting(user_id, kind_of[k], term)
        stored_lists[(k, term)] = (await client.get(n_key), await client.get(v_key))
    return {
        "docs": text(await client.hgetall(docs_key)),
        "terms": text(await client.hgetall(terms_key)),
        "ids": text(await client.hgetall(index.keys.ids(user_id))),
        "exp": {k.decode(): s for k, s in await client.zrange(exp_key, 0, -1, withscores=True)},
        "stats": stats,
        "lists": stored_lists,
    }


@pytest.mark.redis
async def test_upserts_store_exactly_layout_2(index: RedisIndex) -> None:
    rng = random.Random(7)
    batches = [_batch(rng, range(0, 40)), _batch(rng, range(40, 45)), _batch(rng, range(45, 46))]
    for batch in batches:
        await index.upsert(batch)
    want = _layout(batches)
    lists = want["lists"]
    assert isinstance(lists, dict)
    assert await _stored(index, "u1", sorted(lists)) == want


@pytest.mark.redis
async def test_replacements_and_removals_find_what_the_upsert_stored(index: RedisIndex) -> None:
    """The terms an upsert stored are what later replacements and removals use to find a
    document's postings: afterwards search equals an index that only saw the survivors."""
    rng = random.Random(3)
    live: dict[str, IndexedDoc] = {}
    for round_ in range(4):
        batch = _batch(rng, range(round_ * 10, round_ * 10 + 30))
        await index.upsert(batch)
        for d in batch:
            live[d.doc_id] = d
        gone = rng.sample(sorted(live), 5)
        await index.remove("u1", gone)
        for doc_id in gone:
            del live[doc_id]
    survivors = [d for d in live.values() if d.expires_at is None or d.expires_at > T0]
    client = index._io.client
    numbers = {int(n) for n in await client.hkeys(index.keys.ids("u1"))}
    for d in survivors:
        for term in terms_of(d):
            n_key, v_key = index.keys.posting("u1", d.kind, term)
            held = unpack_postings(await client.get(n_key), await client.get(v_key))
            assert set(held) <= numbers  # no posting of a removed document is live
    fresh = InProcessIndex(clock=FakeClock(T0))
    await fresh.upsert(survivors)
    for query in ("w1", "berserk guts", "ホラー 好き", " ".join(WORDS)):
        for kinds in (KINDS, ("memory",), ("turn", "chunk")):
            got = await index.search("u1", query, kinds=kinds, limit=50)
            assert got == await fresh.search("u1", query, kinds=kinds, limit=50)
