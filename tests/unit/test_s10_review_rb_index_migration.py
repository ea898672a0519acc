"""Review of the SQLite index without FTS5 (index migration 3): the migration's atomicity
and locking, documents without an FTS5 row, and uncached searches on hostile query text.

The failure mid-migration is made by SQLite itself (an authorizer refusing the migration's
``DROP TABLE``): a real statement failing inside the real migration transaction.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tiermem.clock import FakeClock
from tiermem.longterm.index import DocKind, IndexedDoc, terms_of
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.index_sqlite import (
    INDEX_COMPONENT,
    INDEX_MIGRATIONS,
    SQLiteIndex,
    _owner_token,
    apply_index_migrations,
)

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
ALL: tuple[DocKind, ...] = ("turn", "memory", "chunk")
TEXTS = [
    "berserk volume delivery late",
    "refund order café naïve",
    "漫画 好きなジャンル berserk",
    "monster box set 42 2026",
    "late late refund",
]


def _docs() -> list[IndexedDoc]:
    return [
        IndexedDoc(
            user_id="u1", doc_id=f"d{n}", kind="turn", text=text, created_at=T0, expires_at=None
        )
        for n, text in enumerate(TEXTS)
    ]


def _old_file(
    path: Path, docs: list[IndexedDoc], *, skip_fts: frozenset[str] = frozenset()
) -> None:
    """A file at index version 2 as the code before migration 3 wrote it; documents in
    ``skip_fts`` get no FTS5 row (a file damaged or written half by hand)."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE schema_versions (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        for migration in INDEX_MIGRATIONS[:2]:
            for statement in migration:
                conn.execute(statement)
        conn.execute("INSERT INTO schema_versions VALUES (?, 2)", (INDEX_COMPONENT,))
        total = 0
        for doc in docs:
            counts = terms_of(doc)
            length = sum(counts.values())
            total += length
            rowid = conn.execute(
                "INSERT INTO recall_docs (user_id, doc_id, kind, length, created_at_us, "
                "expires_at_us) VALUES (?, ?, ?, ?, ?, NULL)",
                (doc.user_id, doc.doc_id, doc.kind, length, int(T0.timestamp() * 1e6)),
            ).lastrowid
            if doc.doc_id not in skip_fts:
                conn.execute(
                    "INSERT INTO recall_fts (rowid, tokens, owner) VALUES (?, ?, ?)",
                    (
                        rowid,
                        " ".join(t for t, tf in counts.items() for _ in range(tf)),
                        _owner_token(doc.user_id),
                    ),
                )
        conn.execute("INSERT INTO recall_users VALUES ('u1', ?, ?)", (len(docs), total))


def _version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(
            conn.execute(
                "SELECT version FROM schema_versions WHERE component = ?", (INDEX_COMPONENT,)
            ).fetchone()[0]
        )


def test_a_migration_failing_at_its_last_statement_leaves_version_2_intact(
    tmp_path: Path,
) -> None:
    """The DROP fails after the ALTER and the copy ran: the file is still at version 2,
    its FTS5 table and rows whole, no ``tokens`` column; a later open migrates it."""
    path = tmp_path / "old.db"
    _old_file(path, _docs())
    conn = sqlite3.connect(path, isolation_level=None)

    def refuse_drop(action: int, arg1: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_DROP_VTABLE or (
            action == sqlite3.SQLITE_DELETE and arg1 == "sqlite_master"
        ):
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    conn.set_authorizer(refuse_drop)
    with pytest.raises(sqlite3.DatabaseError):
        apply_index_migrations(conn, path=str(path))
    assert not conn.in_transaction
    conn.close()
    assert _version(path) == 2
    with sqlite3.connect(path) as check:
        columns = {row[1] for row in check.execute("PRAGMA table_info(recall_docs)")}
        fts_rows = check.execute("SELECT count(*) FROM recall_fts").fetchone()[0]
    assert "tokens" not in columns
    assert fts_rows == len(TEXTS)
    again = sqlite3.connect(path, isolation_level=None)
    try:
        assert apply_index_migrations(again, path=str(path)) == [3]
    finally:
        again.close()
    assert _version(path) == 3


def test_two_openers_of_one_old_file_migrate_it_once(tmp_path: Path) -> None:
    """Two connections (as two processes would) migrate at once: one applies migration 3,
    the other waits on the write lock, sees version 3 and applies nothing."""
    path = tmp_path / "old.db"
    _old_file(path, _docs())
    results: list[list[int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def migrate() -> None:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
        try:
            start.wait()
            results.append(apply_index_migrations(conn, path=str(path)))
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=migrate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(results) == [[], [3]]
    with sqlite3.connect(path) as conn:
        tokens = dict(conn.execute("SELECT doc_id, tokens FROM recall_docs").fetchall())
    assert all(tokens[f"d{n}"] for n in range(len(TEXTS)))


async def test_a_document_without_an_fts_row_migrates_and_can_be_rewritten(
    tmp_path: Path,
) -> None:
    """A document whose FTS5 row was missing gets empty tokens: no search finds it (as
    before, when no FTS5 row matched), cached and uncached searches agree, and writing it
    again makes it searchable (the old code's stored-copy lookup, a join on the FTS5 row,
    did not see it and its insert hit the unique key)."""
    clock = FakeClock(T0)
    path = tmp_path / "old.db"
    docs = _docs()
    _old_file(path, docs, skip_fts=frozenset({"d1"}))
    plain = SQLiteIndex(path, clock=clock, cache_users=0)
    cached = SQLiteIndex(path, clock=clock)
    try:
        for query in ("refund", "late refund", "berserk 漫画"):
            got_plain = await plain.search("u1", query, kinds=ALL, limit=10)
            got_cached = await cached.search("u1", query, kinds=ALL, limit=10)
            assert "d1" not in {h.doc_id for h in got_plain}
            assert [h.doc_id for h in got_plain] == [h.doc_id for h in got_cached]
        await plain.upsert([docs[1]])
        hits = await plain.search("u1", "café", kinds=ALL, limit=10)
        assert [h.doc_id for h in hits] == ["d1"]
    finally:
        await plain.aclose()
        await cached.aclose()


@pytest.mark.parametrize(
    "query",
    [
        "refund%",
        "%",
        "_",
        "late_refund",
        "'; DROP TABLE recall_docs; --",
        "berserk') OR 1=1 OR instr(tokens, '",
        '" OR "" = "',
        "lat",  # a prefix of a token: no hit
        "ate",  # a suffix of a token: no hit
        "late refund",  # two tokens adjacent in one document
        "Café NAÏVE",
        "cafe\u0301",  # decomposed: NFKC makes it café
    ],
)
async def test_uncached_search_of_hostile_text_equals_the_in_process_index(
    tmp_path: Path, query: str
) -> None:
    """LIKE/instr special characters, quotes and SQL in a query are only terms (bound as
    parameters); substrings of tokens do not match; hits and scores equal the reference."""
    clock = FakeClock(T0)
    docs = _docs()
    reference = InProcessIndex(clock=clock)
    index = SQLiteIndex(tmp_path / "new.db", clock=clock, cache_users=0)
    try:
        await reference.upsert(docs)
        await index.upsert(docs)
        want = await reference.search("u1", query, kinds=ALL, limit=10)
        got = await index.search("u1", query, kinds=ALL, limit=10)
        assert [(h.doc_id, h.kind) for h in got] == [(h.doc_id, h.kind) for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-12)
        assert len(await index.search("u1", "berserk", kinds=ALL, limit=10)) == 2
    finally:
        await index.aclose()
        await reference.aclose()


async def test_an_uncached_search_of_a_long_query_runs_and_equals_the_reference(
    tmp_path: Path,
) -> None:
    """A pasted paragraph of 300 distinct words: one ``instr`` test per kept term is joined
    into the statement, so the term cap (64) must keep it within SQLite's limits on
    expression depth and bound parameters; the hits equal the in-process index's."""
    clock = FakeClock(T0)
    docs = _docs()
    query = " ".join(f"filler{n}" for n in range(300)) + " berserk"
    reference = InProcessIndex(clock=clock)
    index = SQLiteIndex(tmp_path / "new.db", clock=clock, cache_users=0)
    try:
        await reference.upsert(docs)
        await index.upsert(docs)
        want = await reference.search("u1", query, kinds=ALL, limit=10)
        got = await index.search("u1", query, kinds=ALL, limit=10)
        assert [h.doc_id for h in got] == [h.doc_id for h in want]
        long_tail = " ".join(f"filler{n}" for n in range(60)) + " berserk"
        got = await index.search("u1", long_tail, kinds=ALL, limit=10)
        assert sorted(h.doc_id for h in got) == ["d0", "d2"]
    finally:
        await index.aclose()
        await reference.aclose()


_MIGRATE_AND_STALL = """
import sqlite3, sys, time
from tiermem.longterm.index_sqlite import apply_index_migrations
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
started: list[str] = []
conn.set_trace_callback(started.append)
def stall() -> int:
    # Stop inside the copy of the tokens, after the ALTER TABLE ran in the same transaction.
    # (FTS5's own reads are traced too, after the UPDATE.)
    if any(text.startswith("UPDATE recall_docs SET tokens") for text in started):
        print("mid", flush=True)
        time.sleep(600)
    return 0
conn.set_progress_handler(stall, 1000)
apply_index_migrations(conn, path=sys.argv[1])
print("done", flush=True)
"""


def test_a_process_killed_mid_migration_leaves_a_file_that_migrates_again(
    tmp_path: Path,
) -> None:
    """A real process is SIGKILLed while its migration transaction is open (it stops
    itself at a progress callback and tells us): the file opens at version 2 with every
    FTS5 row, and the next open migrates it with every document's tokens."""
    path = tmp_path / "old.db"
    docs = [
        IndexedDoc(
            user_id="u1",
            doc_id=f"d{n}",
            kind="turn",
            text=f"{TEXTS[n % len(TEXTS)]} word{n}",
            created_at=T0,
            expires_at=None,
        )
        for n in range(400)
    ]
    _old_file(path, docs)
    child = subprocess.Popen(  # noqa: S603 -- this interpreter and a fixed script
        [sys.executable, "-c", _MIGRATE_AND_STALL, str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "mid"
    finally:
        child.kill()
        child.wait()
    assert _version(path) == 2
    with sqlite3.connect(path) as check:
        columns = {row[1] for row in check.execute("PRAGMA table_info(recall_docs)")}
        fts_rows = check.execute("SELECT count(*) FROM recall_fts").fetchone()[0]
    assert "tokens" not in columns
    assert fts_rows == len(docs)
    again = sqlite3.connect(path, isolation_level=None)
    try:
        assert apply_index_migrations(again, path=str(path)) == [3]
        tokens = dict(again.execute("SELECT doc_id, tokens FROM recall_docs").fetchall())
    finally:
        again.close()
    assert len(tokens) == len(docs)
    assert all(f"word{n}" in tokens[f"d{n}"].split(" ") for n in range(len(docs)))
