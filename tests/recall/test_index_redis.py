"""What only the Redis index does: key layout, packed posting lists, concurrent writers, the
doc-number cache, and the migration from layout 1 (hashes of decimal postings).

Every test runs against a real Redis (``TIERMEM_TEST_REDIS_URL``); the ones that check
slots and concurrency run against the cluster too where it is available.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from tests.conftest import server_url
from tests.recall.conftest import T0, days, doc, held_doc_ids
from tiermem.longterm import index_redis_scripts
from tiermem.longterm import postings as postings_module
from tiermem.longterm.index import DocKind, IndexedDoc, terms_of
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.index_redis import LEGACY_LAYOUT, RedisIndex
from tiermem.longterm.postings import (
    POSTING_SHIFT,
    bm25_scores,
    bm25_top,
    bm25_top_packed,
    pack_numbers,
    pack_values,
    top_scores,
    unpack_numbers,
    unpack_postings,
)
from tiermem.longterm.recall import turn_docs
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn

ALL: tuple[DocKind, ...] = ("memory", "turn", "chunk")
WORDS = [f"w{i}" for i in range(14)] + ["berserk", "guts"]


def _open(prefix: str, clock: FakeClock | None = None, backend: str = "redis") -> RedisIndex:
    if backend == "redis-cluster":
        return RedisIndex.from_url(server_url(backend), prefix=prefix, clock=clock, cluster=True)
    return RedisIndex.from_url(server_url(backend), prefix=prefix, clock=clock)


@pytest.fixture
async def redis_index() -> AsyncIterator[RedisIndex]:
    from tests.backends.redis import fresh_prefix

    index = _open(fresh_prefix(), FakeClock(T0))
    try:
        yield index
    finally:
        await index.aclose()


async def _keys(index: RedisIndex) -> list[str]:
    """Every key under the index's prefix (on every node of a cluster)."""
    from redis.asyncio.cluster import RedisCluster

    client = index._io.client
    pattern = f"{index.keys.prefix}:*"
    if isinstance(client, RedisCluster):
        raw = await client.keys(pattern, target_nodes=RedisCluster.PRIMARIES)
    else:
        raw = await client.keys(pattern)
    return sorted({k.decode() for k in raw})


async def _check_lists(index: RedisIndex, user_id: str, docs: Sequence[IndexedDoc]) -> None:
    """Each (kind, term) list holds exactly the live documents' postings, numbers
    ascending, numbers and values parallel, and as many tombstones as ``dead`` says (fewer
    than a quarter of it); no other list exists."""
    client = index._io.client
    _, _, stats, _ = index.keys.index(user_id)
    numbers = {
        int(n): raw.decode()[1:]  # the kind's letter, then the id
        for n, raw in (await client.hgetall(index.keys.ids(user_id))).items()
    }
    want: dict[tuple[DocKind, str], dict[str, int]] = {}
    for d in docs:
        counts = terms_of(d)
        for term, tf in counts.items():
            want.setdefault((d.kind, term), {})[d.doc_id] = (
                sum(counts.values()) * POSTING_SHIFT + tf
            )
    dead = {k.decode(): int(v) for k, v in (await client.hgetall(index.keys.dead(user_id))).items()}
    for (kind, term), posting in want.items():
        n_key, v_key = index.keys.posting(user_id, kind, term)
        packed_numbers, packed_values = await client.get(n_key), await client.get(v_key)
        got = unpack_postings(packed_numbers, packed_values)
        in_order = list(unpack_numbers(packed_numbers))
        assert in_order == sorted(in_order)
        assert len(packed_values) == 2 * len(packed_numbers)
        assert {numbers[n]: value for n, value in got.items()} == posting
        tombstones = len(in_order) - len(got)
        assert dead.get(f"{kind[0]}:{term}", 0) == tombstones
        assert 4 * tombstones <= len(in_order)
    assert set(dead) <= {f"{kind[0]}:{term}" for kind, term in want}
    lists = [k for k in await _keys(index) if ":n=" in k or ":v=" in k]
    assert len(lists) == 2 * len(want)
    assert int(await client.hget(stats, "n") or 0) == len(docs)


# -- layout --------------------------------------------------------------------------------


@pytest.mark.redis
async def test_redis_index_keys_live_under_the_users_hash_tag() -> None:
    from tests.backends.redis import fresh_prefix

    prefix = fresh_prefix()
    index = _open(prefix)
    try:
        await index.upsert([doc("a", "berserk 漫画", user_id="we{ir}d:id")])
        keys = await _keys(index)
        tag = "{u=we%7Bir%7Dd%3Aid}"
        assert keys
        assert all(k.startswith(f"{prefix}:{tag}:ix2:") for k in keys)
        assert {f"{prefix}:{tag}:ix2:m:n=漫画", f"{prefix}:{tag}:ix2:m:v=漫画"} <= set(keys)
        assert set(index.keys.posting("we{ir}d:id", "memory", "漫画")) <= set(keys)
        await index.purge_user("we{ir}d:id")
        assert await _keys(index) == []
    finally:
        await index.aclose()


@pytest.mark.redis
async def test_redis_index_scripts_reload_after_a_script_flush(redis_index: RedisIndex) -> None:
    await redis_index.upsert([doc("a", "berserk")])
    await redis_index._io.client.script_flush()
    hits = await redis_index.search("u1", "berserk", kinds=ALL, limit=5)
    assert [h.doc_id for h in hits] == ["a"]
    await redis_index.upsert([doc("b", "berserk")])


@pytest.mark.redis
async def test_redis_index_leaves_no_key_once_everything_expired_is_collected() -> None:
    from tests.backends.redis import fresh_prefix

    clock = FakeClock(T0)
    index = _open(fresh_prefix(), clock)
    try:
        turns = [text_turn(f"berserk {i}").with_index(i) for i in range(10)]
        for user in ("u1", "we{ir}d:id"):
            await index.upsert(turn_docs(user, "s1", turns, expires_at=T0 + days(1)))
        keys = await _keys(index)
        assert any(":ixdue:" in k for k in keys)  # users marked due
        clock.advance(days(1))
        assert await index.collect_expired() == 20
        assert await _keys(index) == []
        # A purge takes the user's mark with it.
        await index.upsert(turn_docs("u1", "s2", turns, expires_at=T0 + days(5)))
        await index.purge_user("u1")
        assert await _keys(index) == []
    finally:
        await index.aclose()


@pytest.mark.redis
async def test_redis_concurrent_collectors_remove_each_document_once() -> None:
    from tests.backends.redis import fresh_prefix

    prefix = fresh_prefix()
    clock = FakeClock(T0)
    first, second = _open(prefix, clock), _open(prefix, clock)
    try:
        turns = [text_turn(f"berserk {i}").with_index(i) for i in range(7)]
        users = [f"u{i}" for i in range(40)]
        for user in users:
            await first.upsert(turn_docs(user, "s1", turns, expires_at=T0 + days(1)))
        clock.advance(days(1))
        counts = await asyncio.gather(*(c.collect_expired(50) for c in (first, second) * 4))
        # A collector that finds the due users taken by another stops early: sweep the rest.
        while removed := await second.collect_expired(50):
            counts.append(removed)
        assert sum(counts) == 40 * 7  # each document counted by exactly one collector
        for user in users:
            assert await held_doc_ids(first, user) == set()
    finally:
        await first.aclose()
        await second.aclose()


@pytest.mark.redis
async def test_redis_search_hides_many_expired_uncollected_documents() -> None:
    """More expired, uncollected documents than a write collects: a search answers none of
    them (they outscore the live one), whatever the limit."""
    from tests.backends.redis import fresh_prefix

    clock = FakeClock(T0)
    index = _open(fresh_prefix(), clock)
    try:
        count = 1100
        await index.upsert(
            [doc(f"e{i}", "berserk", kind="turn", expires_at=T0 + days(1)) for i in range(count)]
        )
        await index.upsert([doc("live", "berserk volume deluxe")])
        clock.advance(days(2))
        for limit in (3, count + 10):
            hits = await index.search("u1", "berserk", kinds=ALL, limit=limit)
            assert [h.doc_id for h in hits] == ["live"]
    finally:
        await index.aclose()


# -- packed lists ----------------------------------------------------------------------------


@pytest.mark.redis
async def test_redis_packed_lists_follow_rewrites_removals_and_expiry(
    redis_index: RedisIndex,
) -> None:
    """After random writes, replacements, removals and collections, every packed list holds
    exactly the live documents' postings, in number order, and search equals an index that
    saw only the survivors."""
    clock = redis_index._clock
    assert isinstance(clock, FakeClock)
    rng = random.Random(11)
    live: dict[str, IndexedDoc] = {}
    for round_ in range(5):
        batch = []
        for _ in range(40):
            doc_id = f"d{rng.randrange(70)}"
            kind: DocKind = rng.choice(ALL)
            expires = T0 + days(round_ + rng.choice((0.5, 30))) if kind == "turn" else None
            text = " ".join(rng.choices(WORDS, k=rng.randint(1, 8)))
            batch.append(doc(doc_id, text, kind=kind, expires_at=expires))
        await redis_index.upsert(batch)
        for d in batch:
            live[d.doc_id] = d
        gone = rng.sample(sorted(live), 6)
        await redis_index.remove("u1", gone)
        for doc_id in gone:
            del live[doc_id]
        clock.advance(days(1))
        await redis_index.collect_expired()
        live = {k: d for k, d in live.items() if d.expires_at is None or d.expires_at > clock.now()}
        await _check_lists(redis_index, "u1", list(live.values()))
    fresh = InProcessIndex(clock=clock)
    await fresh.upsert(list(live.values()))
    for query in ("w1", "berserk guts", "w0 w3 w5 w7 w9 w11", " ".join(WORDS)):
        for kinds in (ALL, ("memory",), ("turn", "chunk")):
            for limit in (1, 4, 50):
                got = await redis_index.search("u1", query, kinds=kinds, limit=limit)
                want = await fresh.search("u1", query, kinds=kinds, limit=limit)
                assert [(h.doc_id, h.kind) for h in got] == [(h.doc_id, h.kind) for h in want]
                assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-12)


@pytest.mark.redis
async def test_redis_removals_find_postings_in_long_unevenly_numbered_lists(
    redis_index: RedisIndex,
) -> None:
    """Lists longer than the scripts' read window, whose numbers are clustered (so the
    first guesses miss): every removal finds its posting, one by one and in batches."""
    rng = random.Random(8)
    first = [doc(f"a{i}", f"common w{i % 7}", kind="turn") for i in range(1500)]
    gap = [doc(f"m{i}", "other words", kind="memory") for i in range(3000)]
    last = [doc(f"b{i}", f"common w{i % 5}", kind="turn") for i in range(600)]
    for batch in (first, gap, last):
        for i in range(0, len(batch), 500):
            await redis_index.upsert(batch[i : i + 500])
    live = {d.doc_id: d for d in (*first, *gap, *last)}
    gone = rng.sample(sorted(k for k in live if not k.startswith("m")), 500)
    for doc_id in gone[:60]:
        await redis_index.remove("u1", [doc_id])
    for i in range(60, len(gone), 110):
        await redis_index.remove("u1", gone[i : i + 110])
    for doc_id in gone:
        del live[doc_id]
    await _check_lists(redis_index, "u1", list(live.values()))
    fresh = InProcessIndex()
    await fresh.upsert(list(live.values()))
    for query in ("common", "common w3", "w1 w4"):
        got = await redis_index.search("u1", query, kinds=ALL, limit=10)
        assert got == await fresh.search("u1", query, kinds=ALL, limit=10)


@pytest.mark.redis
async def test_redis_ties_are_ordered_by_doc_id_not_by_number(redis_index: RedisIndex) -> None:
    ids = [f"d{i:02d}" for i in range(30)]
    random.Random(5).shuffle(ids)  # numbers follow write order, ids do not
    for doc_id in ids:
        await redis_index.upsert([doc(doc_id, "berserk")])
    hits = await redis_index.search("u1", "berserk", kinds=ALL, limit=5)
    assert [h.doc_id for h in hits] == ["d00", "d01", "d02", "d03", "d04"]


@pytest.mark.parametrize("backend", ["redis", "redis-cluster"])
@pytest.mark.redis
async def test_redis_concurrent_writers_of_one_user_keep_the_lists_exact(backend: str) -> None:
    """Several processes (clients) upsert, replace and remove the same user's documents at
    once: the lists end up exactly those of the surviving documents."""
    from tests.backends.redis import fresh_prefix

    prefix = fresh_prefix()
    writers = [_open(prefix, backend=backend) for _ in range(4)]
    try:
        rng = random.Random(2)
        plans: list[list[IndexedDoc]] = [
            [doc(f"w{n}-{i}", " ".join(rng.choices(WORDS, k=rng.randint(2, 9)))) for i in range(60)]
            for n in range(len(writers))
        ]

        async def write(index: RedisIndex, plan: list[IndexedDoc]) -> None:
            for i in range(0, len(plan), 3):
                await index.upsert(plan[i : i + 3])
                if i % 9 == 0:  # replace one, remove another, as the others write
                    await index.upsert([doc(plan[i].doc_id, "berserk guts w1")])
                    await index.remove("u1", [plan[i + 1].doc_id])

        await asyncio.gather(*(write(w, p) for w, p in zip(writers, plans, strict=True)))
        survivors: list[IndexedDoc] = []
        for plan in plans:
            for i, d in enumerate(plan):
                if i % 9 == 0:
                    survivors.append(doc(d.doc_id, "berserk guts w1"))
                elif i % 9 != 1:
                    survivors.append(d)
        await _check_lists(writers[0], "u1", survivors)
        fresh = InProcessIndex()
        await fresh.upsert(survivors)
        for query in ("berserk", "w1 w2 w3", " ".join(WORDS)):
            got = await writers[1].search("u1", query, kinds=ALL, limit=20)
            assert got == await fresh.search("u1", query, kinds=ALL, limit=20)
        await writers[2].purge_user("u1")
        assert await _keys(writers[0]) == []
    finally:
        for w in writers:
            await w.aclose()


@pytest.mark.redis
async def test_redis_id_cache_is_not_used_after_the_numbering_restarts() -> None:
    """One process caches number → doc_id; another empties the user and writes other
    documents (numbers start again under a new epoch): the first answers the new ids."""
    from tests.backends.redis import fresh_prefix

    prefix = fresh_prefix()
    reader, writer = _open(prefix), _open(prefix)
    try:
        await writer.upsert([doc(f"old{i}", "berserk") for i in range(5)])
        assert {h.doc_id for h in await reader.search("u1", "berserk", kinds=ALL, limit=9)} == {
            f"old{i}" for i in range(5)
        }
        await writer.purge_user("u1")
        await writer.upsert([doc(f"new{i}", "berserk") for i in range(5)])
        assert {h.doc_id for h in await reader.search("u1", "berserk", kinds=ALL, limit=9)} == {
            f"new{i}" for i in range(5)
        }
        # The same numbers, emptied by removals this time (the statistics go with the last).
        await writer.remove("u1", [f"new{i}" for i in range(5)])
        await writer.upsert([doc(f"third{i}", "berserk") for i in range(5)])
        assert {h.doc_id for h in await reader.search("u1", "berserk", kinds=ALL, limit=9)} == {
            f"third{i}" for i in range(5)
        }
    finally:
        await reader.aclose()
        await writer.aclose()


def test_bm25_top_with_ties_adds_every_document_tied_with_the_last() -> None:
    postings = [(40, {n: 5 * POSTING_SHIFT + 1 for n in range(40)}), (3, {7: POSTING_SHIFT + 2})]
    top = bm25_top(postings, 100, 5.0, 3, lambda n: True, ties=True)
    assert top[0][0] == 7
    assert sorted(n for n, _ in top[1:]) == [n for n in range(40) if n != 7]
    plain = top_scores(bm25_scores(postings, 100, 5.0), 3, lambda n: True)
    assert bm25_top(postings, 100, 5.0, 3, lambda n: True) == plain == top[:1] + sorted(top[1:])[:2]


@pytest.mark.parametrize("numpy", [True, False])
@pytest.mark.parametrize("seed", range(25))
def test_packed_top_equals_scoring_everything(
    seed: int, numpy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring packed lists (with numpy, and the pure Python fallback) gives the plain top
    of every score to the bit, plus every document tied with the last, hidden ones left
    out."""
    if numpy and postings_module._np is None:
        pytest.skip("numpy is not installed")
    if not numpy:
        monkeypatch.setattr(postings_module, "_np", None)
    rng = random.Random(seed)
    docs = sorted(rng.sample(range(1, 5000), rng.randint(5, 400)))
    lists, plain = [], []
    for _ in range(rng.randint(1, 6)):
        held = sorted(rng.sample(docs, rng.randint(1, len(docs))))
        values = [rng.randint(3, 30) * POSTING_SHIFT + rng.randint(1, 3) for _ in held]
        df = len(held) + rng.randint(0, 5)  # other kinds' lists count in df too
        plain.append((df, dict(zip(held, values, strict=True))))
        # Tombstones of removed documents (value 0) between the live postings.
        for gone in rng.sample(range(5000, 5100), rng.randint(0, 3)):
            at = rng.randint(0, len(held))
            held.insert(at, gone)
            values.insert(at, 0)
        lists.append((df, pack_numbers(held), pack_values(values)))
        if rng.random() < 0.2:
            lists.append((df, b"", b""))  # an asked kind without the term
    count = rng.randint(1, 40)
    hidden = set(rng.sample(docs, rng.randint(0, len(docs) // 2)))
    want = top_scores(bm25_scores(plain, len(docs), 12.5), count, lambda n: n not in hidden)
    got = bm25_top_packed(lists, len(docs), 12.5, count, hidden)
    assert sorted(got, key=lambda pair: (-pair[1], pair[0]))[:count] == want
    if len(want) == count:
        assert {n for n, s in got} == {
            n
            for n, s in bm25_scores(plain, len(docs), 12.5).items()
            if s >= want[-1][1] and n not in hidden
        }


def test_packed_lists_round_trip() -> None:
    numbers, values = [1, 7, 4_000_000_000], [POSTING_SHIFT + 1, 9, 2**45 * 3 + 7]
    assert list(unpack_numbers(pack_numbers(numbers))) == numbers
    assert unpack_postings(pack_numbers(numbers), pack_values(values)) == dict(
        zip(numbers, values, strict=True)
    )
    # Little-endian on every machine: the Lua scripts write struct.pack('<I4') / ('<I8').
    assert pack_numbers([1]) == b"\x01\x00\x00\x00"
    assert pack_values([1]) == b"\x01" + b"\x00" * 7
    # A value of 0 is a removed document's tombstone.
    assert unpack_postings(pack_numbers([1, 2, 3]), pack_values([5, 0, 6])) == {1: 5, 3: 6}


# -- migration from layout 1 -------------------------------------------------------------------


async def _write_layout_1(index: RedisIndex, docs: Sequence[IndexedDoc]) -> None:
    """Documents as the former index wrote them (hashes of decimal ``length·2^20 + tf``)."""
    client = index._io.client
    for d in docs:
        docs_key, terms_key, stats_key, exp_key = index.keys.index(d.user_id, layout=LEGACY_LAYOUT)
        counts = terms_of(d)
        length = sum(counts.values())
        await client.hset(docs_key, d.doc_id, f"{d.kind}|{length}")
        await client.hset(terms_key, d.doc_id, " ".join(counts))
        for term, tf in counts.items():
            key = index.keys.legacy_posting(d.user_id, d.kind, term)
            await client.hset(key, d.doc_id, str(length * POSTING_SHIFT + tf))
        if d.expires_at is not None:
            await client.zadd(exp_key, {d.doc_id: int(d.expires_at.timestamp() * 1_000_000)})
        await client.hincrby(stats_key, "n", 1)
        await client.hincrby(stats_key, "len", length)


@pytest.mark.redis
async def test_redis_search_migrates_a_layout_1_user_first(redis_index: RedisIndex) -> None:
    clock = redis_index._clock
    assert isinstance(clock, FakeClock)
    rng = random.Random(4)
    old = [
        doc(f"d{i}", " ".join(rng.choices(WORDS, k=rng.randint(1, 7))), kind=rng.choice(ALL))
        for i in range(450)  # more than one migration page
    ]
    old.append(doc("soon", "berserk guts", kind="turn", expires_at=T0 + days(1)))
    old.append(doc("later", "berserk", kind="turn", expires_at=T0 + days(9)))
    await _write_layout_1(redis_index, old)
    await _write_layout_1(redis_index, [doc("other", "berserk", user_id="u2")])
    # Writes before the migration: a removal and a replacement must win over layout 1.
    await redis_index.remove("u1", ["d0", "d1"])
    await redis_index.upsert([doc("d2", "vagabond musashi")])
    clock.advance(days(2))  # "soon" expired in layout 1
    survivors = [d for d in old if d.doc_id not in {"d0", "d1", "d2", "soon"}]
    survivors.append(doc("d2", "vagabond musashi"))

    fresh = InProcessIndex(clock=clock)
    await fresh.upsert(survivors)
    for query in ("berserk", "vagabond", "w1 w4 guts", " ".join(WORDS)):
        got = await redis_index.search("u1", query, kinds=ALL, limit=12)
        want = await fresh.search("u1", query, kinds=ALL, limit=12)
        assert [h.doc_id for h in got] == [h.doc_id for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-12)
    assert redis_index.migrations == 1
    assert not any(":ix:" in k and "u=u1" in k for k in await _keys(redis_index))
    await _check_lists(redis_index, "u1", survivors)
    assert await redis_index.migrate_user("u1") is False
    # The migrated expiry still counts: "later" goes when due.
    clock.advance(days(8))
    assert await redis_index.collect_expired() == 1
    assert "later" not in {
        h.doc_id for h in await redis_index.search("u1", "berserk", kinds=ALL, limit=500)
    }
    # Another user is untouched until its own search (or an explicit migration).
    assert any("u=u2}:ix:" in k for k in await _keys(redis_index))
    assert await redis_index.migrate_user("u2") is True
    assert [h.doc_id for h in await redis_index.search("u2", "berserk", kinds=ALL, limit=5)] == [
        "other"
    ]
    await redis_index.purge_user("u1")
    await redis_index.purge_user("u2")
    assert [k for k in await _keys(redis_index) if ":ixdue:" not in k] == []


@pytest.mark.redis
async def test_redis_purge_reaches_an_unmigrated_user(redis_index: RedisIndex) -> None:
    await _write_layout_1(redis_index, [doc(f"d{i}", "berserk secret") for i in range(30)])
    await redis_index.purge_user("u1")
    assert await _keys(redis_index) == []
    assert await redis_index.search("u1", "secret", kinds=ALL, limit=5) == []


# -- races and limits found in review --------------------------------------------------------


def _run_between(index: RedisIndex, after: str, hook: object, occurrence: int = 1) -> None:
    """Make ``index`` send each pipelined command on its own and run ``hook`` once, right
    after the ``occurrence``-th command ``after`` (a command name or a script's name).
    A fake of the interleaving only: Redis does run other clients' commands between a
    pipeline's, but a test cannot make that happen at a chosen point."""
    io = index._io
    real = io.batch
    state = {"seen": 0}

    async def batch(commands: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        for command in commands:
            out += await real([command])
            first = command.script.name if command.script is not None else command.args[0]
            if first == after:
                state["seen"] += 1
                if state["seen"] == occurrence:
                    await hook()  # type: ignore[operator]
        return out

    io.batch = batch  # type: ignore[method-assign]


@pytest.mark.redis
async def test_redis_purge_racing_an_upsert_leaves_exact_lists() -> None:
    """An upsert lands between the purge's last check and its final delete: the purge must
    not delete the statistics and number table under the new document (its posting lists
    would stay, orphaned, and the next numbers would repeat theirs)."""
    from tests.backends.redis import fresh_prefix

    prefix = fresh_prefix()
    purger, writer = _open(prefix), _open(prefix)
    try:
        await writer.upsert([doc("a", "berserk")])

        async def upsert_meanwhile() -> None:
            await writer.upsert([doc("late", "berserk guts")])

        # The purge reads the ids (a), removes them, reads again (none): the upsert lands
        # right after that second read.
        _run_between(purger, "HKEYS", upsert_meanwhile, occurrence=3)
        await purger.purge_user("u1")
        await writer.upsert([doc("next", "berserk")])
        held = await held_doc_ids(writer, "u1")
        assert held in ({"next"}, {"late", "next"})
        survivors = [doc("next", "berserk")]
        if "late" in held:
            survivors.append(doc("late", "berserk guts"))
        await _check_lists(writer, "u1", survivors)
    finally:
        await purger.aclose()
        await writer.aclose()


@pytest.mark.redis
async def test_redis_numbering_restarted_within_one_upsert_gets_a_new_epoch() -> None:
    """Another process empties the user between two scripts of one large upsert, so the
    second script numbers from 1 again: a reader that cached the first script's numbers
    must not answer the removed documents' ids for the new ones."""
    from tests.backends.redis import fresh_prefix

    prefix = fresh_prefix()
    writer, reader, remover = _open(prefix), _open(prefix), _open(prefix)
    try:
        first = [doc(f"a{i:03d}", "berserk") for i in range(200)]  # one script's worth
        second = [doc(f"b{i:03d}", "berserk") for i in range(20)]

        async def read_then_empty() -> None:
            hits = await reader.search("u1", "berserk", kinds=ALL, limit=300)
            assert len(hits) == 200  # the reader caches numbers 1..200
            await remover.remove("u1", [d.doc_id for d in first])

        _run_between(writer, "index_upsert", read_then_empty)
        await writer.upsert([*first, *second])
        hits = await reader.search("u1", "berserk", kinds=ALL, limit=300)
        assert {h.doc_id for h in hits} == {d.doc_id for d in second}
    finally:
        for index in (writer, reader, remover):
            await index.aclose()


@pytest.mark.redis
async def test_redis_document_numbers_never_wrap(redis_index: RedisIndex) -> None:
    """Numbers are u32: an upsert that would pass 2^32 - 1 fails with a clear error and
    changes nothing, rather than writing wrapped (unordered, repeated) numbers."""
    from tiermem.errors import BackendError

    await redis_index.upsert([doc("a", "berserk")])
    stats = redis_index.keys.index("u1")[2]
    await redis_index._io.client.hset(stats, "next", 2**32 - 3)
    await redis_index.upsert([doc("b", "berserk")])  # number 2^32 - 2: still fits
    with pytest.raises(BackendError, match="purge_user"):
        await redis_index.upsert([doc(f"c{i}", "berserk") for i in range(3)])
    assert await held_doc_ids(redis_index, "u1") == {"a", "b"}
    await _check_lists(redis_index, "u1", [doc("a", "berserk"), doc("b", "berserk")])
    hits = await redis_index.search("u1", "berserk", kinds=ALL, limit=5)
    assert [h.doc_id for h in hits] == ["a", "b"]


@pytest.mark.redis
async def test_redis_id_cache_is_bounded_across_users_and_can_be_cleared(
    redis_index: RedisIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiermem.longterm import index_redis

    monkeypatch.setattr(index_redis, "_ID_CACHE_TOTAL", 50)
    for user in range(6):
        await redis_index.upsert([doc(f"d{i}", "berserk", user_id=f"u{user}") for i in range(20)])
        hits = await redis_index.search(f"u{user}", "berserk", kinds=ALL, limit=20)
        assert len(hits) == 20
        assert redis_index.cached_doc_ids <= 50
    assert redis_index.cached_doc_ids > 0
    redis_index.clear_caches()
    assert redis_index.cached_doc_ids == 0
    # A search whose missing ids push the cache over its bound still answers the ids it
    # had cached before (the cache starts again after the answer is complete).
    monkeypatch.setattr(index_redis, "_ID_CACHE_TOTAL", 12)
    await redis_index.upsert(
        [doc(f"p{i:02d}", " ".join(["berserk", *["pad"] * i]), user_id="p") for i in range(20)]
    )
    assert len(await redis_index.search("p", "berserk", kinds=ALL, limit=5)) == 5
    hits = await redis_index.search("p", "berserk", kinds=ALL, limit=20)
    assert [h.doc_id for h in hits] == [f"p{i:02d}" for i in range(20)]
    assert redis_index.cached_doc_ids <= 12


async def _keys_touched_by_scripts(
    index: RedisIndex, action: Any
) -> list[tuple[set[str], set[str]]]:
    """Run ``action`` under MONITOR: per script run, (its declared keys, the keys its Lua
    commands touched). Standalone Redis only (MONITOR is per node)."""
    from redis.asyncio import Redis

    watcher = Redis.from_url(server_url("redis"))
    runs: list[tuple[set[str], set[str]]] = []
    marker = f"end-{random.random()}"
    try:
        async with watcher.monitor() as monitor:
            await action()
            await index._io.client.echo(marker)
            while True:
                seen = await monitor.next_command()
                words = seen["command"].split(" ")
                if words[0] == "ECHO" and words[1] == marker:
                    break
                if words[0] == "EVALSHA":
                    runs.append((set(words[3 : 3 + int(words[2])]), set()))
                elif seen["client_type"] == "lua" and runs:
                    # Every command these scripts run names keys only (DEL) or one key first.
                    touched = words[1:] if words[0] == "DEL" else words[1:2]
                    runs[-1][1].update(touched)
    finally:
        await watcher.aclose()
    return runs


@pytest.mark.redis
async def test_redis_read_and_purge_scripts_declare_every_key_they_touch(
    redis_index: RedisIndex,
) -> None:
    """Redis Cluster routes and migrates a script by its declared keys: the search script
    and the purge's last step touch no other key (writes cannot: see the module docs)."""
    await redis_index.upsert([doc("a", "berserk guts"), doc("t", "berserk", kind="turn")])

    async def search() -> None:
        await redis_index.search("u1", "berserk guts musashi", kinds=("memory",), limit=5)
        await redis_index.search("u1", "berserk", kinds=ALL, limit=5)

    # (A run that touched nothing was refused with NOSCRIPT and sent again.)
    runs = [run for run in await _keys_touched_by_scripts(redis_index, search) if run[1]]
    assert len(runs) == 2
    for declared, touched in runs:
        assert touched <= declared

    async def last_step() -> None:
        await redis_index.remove("u1", ["a", "t"])
        await redis_index._io.batch(
            [index_redis_scripts.INDEX_DROP_EMPTY.command(redis_index.keys.drop_empty("u1"), [])]
        )

    runs = [run for run in await _keys_touched_by_scripts(redis_index, last_step) if run[1]]
    declared, touched = runs[-1]
    assert declared == set(redis_index.keys.drop_empty("u1"))  # the purge's last step
    assert touched <= declared
