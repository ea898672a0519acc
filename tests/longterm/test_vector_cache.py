"""In-process vector search (:mod:`tiermem.longterm.vector_cache`): exact float64 rankings
from a float32 matrix, kinds as slices, expiry masked per query, a bounded cache."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tiermem.clock import FakeClock
from tiermem.longterm.index import DocKind, IndexedDoc
from tiermem.longterm.index_sqlite import SQLiteIndex
from tiermem.longterm.vector_cache import (
    MAX_CHANGES,
    UserVectors,
    VectorCache,
    VectorRow,
    VectorWrite,
)
from tiermem.longterm.vectors import (
    HAVE_NUMPY,
    cosine,
    cosines,
    pack_vector,
    unit_vector,
    unpack_vector,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
PATHS = [pytest.param(True, id="numpy"), pytest.param(False, id="python")]


def _row(
    doc_id: str, vector: list[float], kind: str = "turn", expires: int | None = None
) -> VectorRow:
    unit = unit_vector(vector)
    assert unit is not None
    return (doc_id, kind, pack_vector(unit), expires)


def _reference(
    rows: list[VectorRow], query: list[float], kinds: set[str], now_us: int, limit: int
) -> list[tuple[str, float]]:
    """Float64 cosine over every stored row (exact sums), best first, ties by doc id."""
    unit = unit_vector(query)
    assert unit is not None
    scored = [
        (doc_id, math.fsum(a * b for a, b in zip(unpack_vector(blob), unit, strict=True)))
        for doc_id, kind, blob, expires in rows
        if kind in kinds and (expires is None or expires > now_us)
    ]
    return sorted(scored, key=lambda pair: (-pair[1], pair[0]))[:limit]


def _search(
    vectors: UserVectors, query: list[float], kinds: set[str], now_us: int, limit: int
) -> list[tuple[str, float]]:
    return [(doc_id, s) for doc_id, _, s in vectors.top(query, kinds, now_us, limit)]


def _near_ties(count: int, dims: int, seed: int) -> tuple[list[VectorRow], list[float]]:
    """Rows around one direction, a few float32 ulps apart, and a query along it: their
    cosines differ by about float32's own rounding, so float32 sums misorder them."""
    rng = random.Random(seed)
    base = [rng.gauss(0, 1) for _ in range(dims)]
    rows = [
        _row(f"d{i:03}", [x + rng.gauss(0, 3e-7) for x in base], rng.choice(["turn", "memory"]))
        for i in range(count)
    ]
    rows.append(_row("dup-b", base))  # exact duplicates: equal scores, ordered by doc id
    rows.append(_row("dup-a", base))
    query = [x + rng.gauss(0, 1e-3) for x in base]
    return rows, query


@pytest.mark.skipif(not HAVE_NUMPY, reason="the float32 path needs numpy")
def test_float32_scoring_returns_the_float64_ranking_and_scores() -> None:
    import numpy as np

    rows, query = _near_ties(300, 384, seed=1)
    vectors = UserVectors(rows, 384)
    # The data is hard: ranking by float32 products alone differs from float64 (so a
    # search without the float64 rescoring would fail below).
    matrix = np.array([list(unpack_vector(r[2])) for r in rows], dtype=np.float32)
    q = np.asarray(unit_vector(query), dtype=np.float32)
    naive = sorted(
        zip((matrix @ q).tolist(), [r[0] for r in rows], strict=True), key=lambda p: (-p[0], p[1])
    )
    exact = _reference(rows, query, {"turn", "memory"}, 0, len(rows))
    assert [d for _, d in naive] != [d for d, _ in exact]
    for limit in (1, 5, 30, 100, len(rows)):
        got = _search(vectors, query, {"turn", "memory"}, 0, limit)
        want = exact[:limit]
        assert [d for d, _ in got] == [d for d, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-12)


@pytest.mark.parametrize("use_numpy", PATHS)
def test_kinds_expiry_and_limits(use_numpy: bool) -> None:
    if use_numpy and not HAVE_NUMPY:
        pytest.skip("numpy is not installed")
    rng = random.Random(2)
    kinds = ["chunk", "memory", "turn"]
    rows = [
        _row(
            f"{kind}-{i}",
            [rng.gauss(0, 1) for _ in range(8)],
            kind,
            expires=rng.choice([None, None, 100, 200]),
        )
        for i in range(40)
        for kind in kinds
    ]
    rng.shuffle(rows)  # the stored order is arbitrary
    vectors = UserVectors(rows, 8, use_numpy=use_numpy)
    query = [rng.gauss(0, 1) for _ in range(8)]
    for wanted in ({"turn"}, {"chunk", "turn"}, {"chunk", "memory", "turn"}, {"memory"}):
        for now_us in (0, 100, 150, 200):
            for limit in (1, 7, 200):
                got = _search(vectors, query, wanted, now_us, limit)
                want = _reference(rows, query, wanted, now_us, limit)
                assert [d for d, _ in got] == [d for d, _ in want], (wanted, now_us, limit)
                assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-9)
                assert all(
                    kind == doc_id.split("-")[0]
                    for doc_id, kind, _ in vectors.top(query, wanted, now_us, limit)
                )
    assert _search(vectors, query, {"summary"}, 0, 5) == []  # a kind the user has none of
    assert vectors.top([0.0] * 8, {"turn"}, 0, 5) == []  # a zero query
    assert vectors.top([1.0] * 9, {"turn"}, 0, 5) == []  # another dimension
    everything_expired = UserVectors([_row("x", [1.0, 0.0], expires=5)], 2, use_numpy=use_numpy)
    assert everything_expired.top([1.0, 0.0], {"turn"}, 5, 3) == []
    assert UserVectors([], 2, use_numpy=use_numpy).top([1.0, 0.0], {"turn"}, 0, 3) == []


def _entry(count: int, dims: int = 4) -> UserVectors:
    return UserVectors([_row(str(i), [1.0] * dims) for i in range(count)], dims)


def test_the_cache_is_bounded_in_entries_and_bytes_and_can_shrink() -> None:
    clock = FakeClock(T0)
    cache = VectorCache(max_entries=3, ttl=timedelta(minutes=5), clock=clock, max_bytes=100)
    cache.put("u1", _entry(2), T0)  # 2 × 4 × 4 = 32 bytes
    cache.put("u2", _entry(2), T0)
    cache.put("u3", _entry(2), T0)
    assert cache.get("u1", 4) is not None  # u1 is now the most recently used
    cache.put("u4", _entry(2), T0)  # a 4th entry: the least recently used (u2) goes
    assert len(cache) == 3
    assert cache.nbytes == 96
    assert cache.get("u2", 4) is None
    cache.put("u5", _entry(3), T0)  # 48 bytes: over 100 in all, so u3 and u1 go
    assert cache.nbytes <= 100
    assert cache.get("u3", 4) is None
    assert cache.get("u1", 4) is None
    assert cache.get("u4", 4) is not None
    assert cache.get("u5", 4) is not None
    cache.put("big", _entry(10), T0)  # alone larger than the bound: kept, alone
    assert len(cache) == 1
    assert cache.get("big", 4) is not None
    cache.put("u1", _entry(1), T0)
    cache.resize(max_bytes=16)  # shrinking evicts at once, least recently used first
    assert len(cache) == 1
    assert cache.get("u1", 4) is not None
    assert cache.nbytes == 16
    cache.resize(max_entries=0)
    assert len(cache) == 0
    assert cache.nbytes == 0


def test_the_cache_forgets_after_the_ttl_and_on_writes() -> None:
    clock = FakeClock(T0)
    cache = VectorCache(max_entries=8, ttl=timedelta(minutes=5), clock=clock)
    cache.put("u1", _entry(2), T0)
    cache.put("u1", _entry(2, dims=8), T0)  # another dimension: its own entry
    cache.put("u2", _entry(2), T0)
    assert cache.get("u1", 4) is not None
    assert cache.get("u1", 8) is not None
    cache.drop_users({"u1"})
    assert cache.get("u1", 4) is None
    assert cache.get("u1", 8) is None
    assert cache.nbytes == 32
    clock.advance(timedelta(minutes=5))
    assert cache.get("u2", 4) is None
    assert cache.nbytes == 0


@pytest.mark.parametrize("use_numpy", PATHS)
def test_cosines_equal_cosine_one_by_one(use_numpy: bool) -> None:
    if use_numpy and not HAVE_NUMPY:
        pytest.skip("numpy is not installed")
    rng = random.Random(3)
    query = [rng.gauss(0, 1) for _ in range(16)]
    vectors = [[rng.gauss(0, 1) for _ in range(16)] for _ in range(10)]
    vectors += [[0.0] * 16, [1.0] * 15, [math.inf] + [0.0] * 15]  # zero, too short, infinite
    got = cosines(query, vectors, use_numpy=use_numpy)
    want = [cosine(query, v) for v in vectors]
    assert [g is None for g in got] == [w is None for w in want] == [False] * 10 + [True] * 3
    assert got[:10] == pytest.approx(want[:10], abs=1e-12)
    assert cosines([0.0] * 16, vectors, use_numpy=use_numpy) == [None] * len(vectors)
    assert cosines(query, [], use_numpy=use_numpy) == []


@pytest.mark.parametrize("use_numpy", PATHS)
def test_writes_applied_to_loaded_vectors_equal_a_fresh_load(use_numpy: bool) -> None:
    if use_numpy and not HAVE_NUMPY:
        pytest.skip("numpy is not installed")
    rng = random.Random(4)
    kinds = ["chunk", "memory", "turn"]

    def random_row(doc_id: str) -> VectorRow:
        vector = [rng.gauss(0, 1) for _ in range(8)]
        return _row(doc_id, vector, rng.choice(kinds), expires=rng.choice([None, 50, 500]))

    stored = {row[0]: row for row in (random_row(f"d{i}") for i in range(50))}
    vectors = UserVectors(list(stored.values()), 8, use_numpy=use_numpy)
    query = [rng.gauss(0, 1) for _ in range(8)]
    for step in range(300):
        doc_id = f"d{rng.randrange(80)}"  # existing rows, and new documents
        if rng.random() < 0.3:
            stored.pop(doc_id, None)
            vectors.write(doc_id, "turn", None, None)  # removed (or stored without a vector)
        else:
            row = random_row(doc_id)
            stored[doc_id] = row
            vectors.write(*row)
        if step % 10 == 0:
            for wanted in ({"turn"}, {"memory", "turn"}, set(kinds)):
                for now_us in (0, 100, 1000):
                    got = vectors.top(query, wanted, now_us, 12)
                    want = _reference(list(stored.values()), query, wanted, now_us, 12)
                    assert [d for d, _, _ in got] == [d for d, _ in want]
                    assert [s for _, _, s in got] == pytest.approx([s for _, s in want], abs=1e-9)
                    assert all(kind == stored[d][1] for d, kind, _ in got)
    assert vectors.changes > 0


def test_a_load_overlapping_a_write_of_its_user_is_not_kept() -> None:
    clock = FakeClock(T0)
    cache = VectorCache(max_entries=8, ttl=timedelta(minutes=5), clock=clock)
    cache.begin_load("u1")
    cache.begin_load("u2")
    cache.apply("u1", [("a", "turn", None, 0, None)])  # written while u1's read was running
    cache.end_load("u1", _entry(2), T0)
    cache.end_load("u2", _entry(2), T0)
    assert cache.get("u1", 4) is None  # it may have read the file before the write
    assert cache.get("u2", 4) is not None
    cache.begin_load("u1")
    cache.end_load("u1", None, T0)  # a failed read keeps nothing and leaves no state
    cache.begin_load("u1")
    cache.end_load("u1", _entry(2), T0)
    assert cache.get("u1", 4) is not None


def test_an_entry_past_its_change_bound_is_dropped() -> None:
    clock = FakeClock(T0)
    cache = VectorCache(max_entries=8, ttl=timedelta(minutes=5), clock=clock)
    cache.put("u1", _entry(4), T0)
    blob = pack_vector((0.5, 0.5, 0.5, 0.5))
    writes: list[VectorWrite] = [(f"new{i}", "turn", blob, 4, None) for i in range(MAX_CHANGES)]
    cache.apply("u1", writes)
    entry = cache.get("u1", 4)
    assert entry is not None
    assert cache.nbytes == (4 + MAX_CHANGES) * 16  # written vectors count in the bound
    assert [d for d, _, _ in entry.top([1.0] * 4, {"turn"}, 0, 2)] == ["0", "1"]
    cache.apply("u1", [("one-more", "turn", blob, 4, None)])
    assert cache.get("u1", 4) is None  # the next query reloads it from the file
    assert cache.nbytes == 0


def _indexed(doc_id: str, text: str, kind: str, embedding: tuple[float, ...] | None) -> IndexedDoc:
    return IndexedDoc.model_validate(
        {
            "user_id": "u1",
            "doc_id": doc_id,
            "kind": kind,
            "text": text,
            "created_at": T0,
            "embedding": embedding,
        }
    )


async def test_the_sqlite_index_applies_its_writes_to_cached_vectors(tmp_path: Path) -> None:
    # Writes (new documents, rewrites with the same or new text, a vector of another
    # dimension or none, expired on arrival, removals) reach the cached matrix without a
    # reload, and searches equal an index without the cache (reading the file each time).
    clock = FakeClock(T0)
    cached = SQLiteIndex(tmp_path / "v.db", clock=clock)
    plain = SQLiteIndex(tmp_path / "v.db", clock=clock, cache_users=0)
    rng = random.Random(5)

    def vector(dims: int = 4) -> tuple[float, ...]:
        return tuple(rng.gauss(0, 1) for _ in range(dims))

    def doc(
        i: int, text: str | None = None, embedding: tuple[float, ...] | None = None
    ) -> IndexedDoc:
        kind = "memory" if i % 3 == 0 else "turn"
        return _indexed(f"d{i}", text or f"word{i}", kind, embedding)

    query = vector()

    async def hits(index: SQLiteIndex, kinds: tuple[DocKind, ...]) -> list[tuple[str, float]]:
        found = await index.vector_search("u1", query, kinds=kinds, limit=15)
        return [(h.doc_id, round(h.score, 9)) for h in found]

    try:
        await cached.upsert([doc(i, embedding=vector()) for i in range(40)])
        assert await hits(cached, ("turn",)) == await hits(plain, ("turn",))
        entry = cached._vectors.get("u1", 4) if cached._vectors is not None else None
        assert entry is not None
        for _ in range(60):
            i = rng.randrange(60)
            choice = rng.randrange(6)
            if choice == 0:
                await cached.upsert([doc(i, embedding=vector())])  # same text: refreshed
            elif choice == 1:
                await cached.upsert([doc(i, f"other{rng.random()}", vector())])  # new text
            elif choice == 2:
                await cached.upsert([doc(i)])  # no vector now
            elif choice == 3:
                await cached.upsert([doc(i, embedding=vector(3))])  # another model's
            elif choice == 4:
                expired = doc(i, embedding=vector()).model_copy(update={"expires_at": T0})
                await cached.upsert([expired])
            else:
                await cached.remove("u1", [f"d{i}"])
            for kinds in (("turn",), ("memory", "turn")):
                assert await hits(cached, kinds) == await hits(plain, kinds)
        assert cached._vectors is not None
        assert cached._vectors.get("u1", 4) is entry  # applied, never reloaded
    finally:
        await cached.aclose()
        await plain.aclose()


@pytest.mark.skipif(not HAVE_NUMPY, reason="the float32 path needs numpy")
def test_the_einsum_product_of_numpy_1_gives_the_same_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tiermem.longterm import vectors

    rows, query = _near_ties(200, 64, seed=6)
    want = _search(UserVectors(rows, 64), query, {"turn", "memory"}, 0, 40)
    monkeypatch.setattr(vectors, "_vecdot", None)  # as on numpy < 2
    got = _search(UserVectors(rows, 64), query, {"turn", "memory"}, 0, 40)
    exact = _reference(rows, query, {"turn", "memory"}, 0, 40)
    assert [d for d, _ in got] == [d for d, _ in want] == [d for d, _ in exact]
    assert [s for _, s in got] == pytest.approx([s for _, s in exact], abs=1e-12)
