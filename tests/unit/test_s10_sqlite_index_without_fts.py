"""The SQLite recall index without its FTS5 table (index migration 3, issue #8).

Searches that read the file (``cache_users=0``) now pick the user's rows holding a query
term with ``instr`` instead of an FTS5 ``MATCH``. These tests hold that the change keeps
what searches return: side by side with the in-process index (the reference every index
matches) and with the FTS5 query it replaced (run here on an FTS5 table of the old shape,
filled with the same tokens), over random documents and queries (ASCII, accents, Japanese,
repeated terms, expired documents, several users); and that a file written before the
migration (its tokens in ``recall_fts``) keeps every document searchable after it.
"""

from __future__ import annotations

import random
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tiermem.clock import FakeClock
from tiermem.longterm.index import IndexedDoc, terms_of
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.index_sqlite import (
    INDEX_COMPONENT,
    INDEX_MIGRATIONS,
    SQLiteIndex,
    _owner_token,
    _rank,
)
from tiermem.longterm.text import query_terms

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
ALL = ("turn", "memory", "chunk")

_WORDS = [
    "berserk", "volume", "volumes", "vagabond", "delivery", "late", "refund", "order",
    "café", "naïve", "straße", "monster", "box", "set", "42", "2026",
    "漫画", "好きなジャンル", "セイネン", "ベルセルク", "東京", "and", "near", "not",
]  # fmt: skip


def _random_docs(rng: random.Random, users: list[str], count: int) -> list[IndexedDoc]:
    docs = []
    for n in range(count):
        words = rng.choices(_WORDS, k=rng.randint(1, 12))
        expiry = rng.choice([None, None, T0 + timedelta(hours=1), T0 + timedelta(days=3)])
        docs.append(
            IndexedDoc(
                user_id=rng.choice(users),
                doc_id=f"d{n}",
                kind=rng.choice(ALL),
                text=" ".join(words),
                created_at=T0,
                expires_at=expiry,
            )
        )
    return docs


def _queries(rng: random.Random) -> list[str]:
    return [" ".join(rng.choices(_WORDS, k=rng.randint(1, 4))) for _ in range(40)] + [
        "nothing matches this",
        "BERSERK Volume",
        "漫画 好き",
    ]


def _hits(hits: list[object]) -> list[tuple[str, str, float]]:
    return [(h.doc_id, h.kind, pytest.approx(h.score, rel=1e-12)) for h in hits]  # type: ignore[attr-defined]


def _fts_reference(
    docs: list[IndexedDoc], user_id: str, query: str, kinds: tuple[str, ...], now_us: int
) -> list[tuple[str, str, float]]:
    """The search the index ran before migration 3: an FTS5 table of the old shape (tokens
    and owner, unicode61, detail=column) matched with the old query, ranked by ``_rank``."""
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE VIRTUAL TABLE recall_fts USING fts5 (tokens, owner, "
        "tokenize = 'unicode61 remove_diacritics 0', detail = column)"
    )
    meta: dict[int, tuple[str, str, int, int | None]] = {}
    total = 0
    for rowid, doc in enumerate(docs, start=1):
        counts = terms_of(doc)
        tokens = " ".join([term for term, tf in counts.items() for _ in range(tf)])
        length = sum(counts.values())
        expires = None if doc.expires_at is None else int(doc.expires_at.timestamp() * 1e6)
        conn.execute(
            "INSERT INTO recall_fts (rowid, tokens, owner) VALUES (?, ?, ?)",
            (rowid, tokens, _owner_token(doc.user_id)),
        )
        if doc.user_id == user_id:
            meta[rowid] = (doc.doc_id, doc.kind, length, expires)
            total += length
    terms = query_terms(query)
    if not terms or not meta:
        return []
    match = (
        f'owner : "{_owner_token(user_id)}" AND tokens : ('
        + " OR ".join(f'"{term}"' for term in terms)
        + ")"
    )
    rows = []
    for rowid, tokens in conn.execute(
        "SELECT rowid, tokens FROM recall_fts WHERE recall_fts MATCH ?", (match,)
    ):
        doc_id, kind, length, expires = meta[rowid]
        rows.append((doc_id, kind, length, tokens, expires is not None and expires <= now_us))
    conn.close()
    hits = _rank(rows, terms, sorted(set(kinds)), len(meta), total / len(meta), 10)  # type: ignore[arg-type]
    return [(h.doc_id, h.kind, h.score) for h in hits]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_file_search_equals_the_reference_and_the_fts5_query(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    clock = FakeClock(T0)
    users = ["u1", "u2", "ü3"]
    docs = _random_docs(rng, users, 150)
    plain = SQLiteIndex(tmp_path / "i.db", clock=clock, cache_users=0)
    cached = SQLiteIndex(tmp_path / "i.db", clock=clock)
    reference = InProcessIndex(clock=clock)
    try:
        for start in range(0, len(docs), 40):
            await plain.upsert(docs[start : start + 40])
        await reference.upsert(docs)
        for hours in (0, 2):  # before and after the first expiries
            clock.set(T0 + timedelta(hours=hours))
            now_us = int(clock.now().timestamp() * 1e6)
            for query in _queries(rng):
                user = rng.choice(users)
                kinds = tuple(rng.sample(ALL, rng.randint(1, 3)))
                want = await reference.search(user, query, kinds=kinds, limit=10)
                got = await plain.search(user, query, kinds=kinds, limit=10)
                assert [(h.doc_id, h.kind, h.score) for h in got] == _hits(want), query
                assert [(h.doc_id, h.kind, h.score) for h in got] == [
                    (d, k, pytest.approx(s, rel=1e-12))
                    for d, k, s in _fts_reference(docs, user, query, kinds, now_us)
                ], query
                if hours == 0:
                    # (After the TTL the cache reloads the user without the expired
                    # documents the file still counts until collected: other statistics,
                    # as before migration 3.)
                    from_cache = await cached.search(user, query, kinds=kinds, limit=10)
                    assert [(h.doc_id, h.kind, h.score) for h in from_cache] == _hits(want)
    finally:
        await plain.aclose()
        await cached.aclose()
        await reference.aclose()


async def test_a_file_written_before_migration_3_keeps_its_documents(tmp_path: Path) -> None:
    """A file at index migration 2, written the way the code before migration 3 wrote it
    (tokens and owner in ``recall_fts``): after opening it, every document is found with
    the same hits as the reference, the FTS5 table is gone, and writes carry on."""
    rng = random.Random(7)
    clock = FakeClock(T0)
    docs = _random_docs(rng, ["u1", "u2"], 60)
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE schema_versions (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        for migration in INDEX_MIGRATIONS[:2]:
            for statement in migration:
                conn.execute(statement)
        conn.execute("INSERT INTO schema_versions VALUES (?, 2)", (INDEX_COMPONENT,))
        stats: dict[str, list[int]] = {}
        for doc in docs:
            counts = terms_of(doc)
            length = sum(counts.values())
            expires = None if doc.expires_at is None else int(doc.expires_at.timestamp() * 1e6)
            rowid = conn.execute(
                "INSERT INTO recall_docs (user_id, doc_id, kind, length, created_at_us, "
                "expires_at_us) VALUES (?, ?, ?, ?, ?, ?)",
                (doc.user_id, doc.doc_id, doc.kind, length, int(T0.timestamp() * 1e6), expires),
            ).lastrowid
            conn.execute(
                "INSERT INTO recall_fts (rowid, tokens, owner) VALUES (?, ?, ?)",
                (
                    rowid,
                    " ".join([t for t, tf in counts.items() for _ in range(tf)]),
                    _owner_token(doc.user_id),
                ),
            )
            entry = stats.setdefault(doc.user_id, [0, 0])
            entry[0] += 1
            entry[1] += length
        conn.executemany(
            "INSERT INTO recall_users VALUES (?, ?, ?)",
            [(user, n, total) for user, (n, total) in stats.items()],
        )
    reference = InProcessIndex(clock=clock)
    await reference.upsert(docs)
    plain = SQLiteIndex(path, clock=clock, cache_users=0)
    cached = SQLiteIndex(path, clock=clock)
    try:
        for query in _queries(rng):
            for user in ("u1", "u2"):
                want = _hits(await reference.search(user, query, kinds=ALL, limit=10))
                got = await plain.search(user, query, kinds=ALL, limit=10)
                assert [(h.doc_id, h.kind, h.score) for h in got] == want, query
                got = await cached.search(user, query, kinds=ALL, limit=10)
                assert [(h.doc_id, h.kind, h.score) for h in got] == want, query
        # Writes go on: a rewrite with the same terms keeps its row, a new text replaces it.
        changed = [
            docs[0].model_copy(update={"created_at": T0 + timedelta(minutes=1)}),
            docs[1].model_copy(update={"text": "entirely new words here"}),
        ]
        await plain.upsert(changed)
        await reference.upsert(changed)
        for query in ("entirely new", docs[0].text, docs[1].text):
            user = docs[1].user_id
            want = _hits(await reference.search(user, query, kinds=ALL, limit=10))
            got = await plain.search(user, query, kinds=ALL, limit=10)
            assert [(h.doc_id, h.kind, h.score) for h in got] == want
    finally:
        await plain.aclose()
        await cached.aclose()
        await reference.aclose()
    with sqlite3.connect(path) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        version = conn.execute(
            "SELECT version FROM schema_versions WHERE component = ?", (INDEX_COMPONENT,)
        ).fetchone()[0]
        empty = conn.execute("SELECT count(*) FROM recall_docs WHERE tokens = ''").fetchone()[0]
    assert not {name for name in tables if name.startswith("recall_fts")}
    assert version == len(INDEX_MIGRATIONS) == 3
    assert empty == 0
