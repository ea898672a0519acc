"""The search index of the embedded deployment: :class:`SQLiteIndex`, in the durable store's
SQLite file.

Tables (its own migrations, tracked in ``schema_versions`` under the component
``recall_index``, since ``PRAGMA user_version`` belongs to the store's schema)::

    schema_versions (component) → version                    shared bookkeeping table
    recall_docs     id INTEGER PRIMARY KEY, (user_id, doc_id) UNIQUE → kind, length,
                    created_at_us, expires_at_us (NULL: never), tokens; partial index
                    on expires_at_us (migration 2)
    recall_users    (user_id) → docs, total_length            BM25 corpus statistics
    recall_vectors  id = recall_docs.id → user_id, dims, float32 blob; index (user_id)

Text is tokenized in Python with :func:`tiermem.longterm.text.tokenize` (CJK bigrams,
stopwords, plural folding) and stored pre-tokenized, space-separated, in ``tokens``. So a
two-character Japanese word such as 漫画 is searchable, which a trigram tokenizer cannot
do (the store's former trigram table, ``memories_fts``, is dropped by store migration 2).

Migration 3 dropped the FTS5 table (``recall_fts``) that held the tokens until then
(issue #8): searches are served from process memory (:class:`_SearchCache`, the default),
which loads a user's documents with a plain read and never used FTS5, while every indexed
document paid FTS5's insert and its pending-term flush at each commit (about a sixth of the
SQLite work of an embedded turn), and a deleted document's terms stayed in its segments
until a merge. Without the cache (``cache_users=0``) a search reads the user's documents
that hold a query term (an ``instr`` test per row in SQLite, over the user's rows only,
through the ``(user_id, doc_id)`` index): the same rows FTS5 matched, so the same hits.

Scores are BM25 over the user's documents, computed in Python from the matched rows and
``recall_users``, not FTS5's ``bm25()``: ``bm25()`` takes its statistics from the whole
table, so one user's scores would depend on every other user's text. The per-user scores
equal the in-process index's.

Expired documents (``expires_at_us`` ≤ the injected clock's now) are left out of hits in
both searches; each ``upsert`` transaction deletes up to
:func:`~tiermem.longterm.index_memory.collect_budget` of them (any user's, earliest
first, through the partial index: no scan), and :meth:`SQLiteIndex.collect_expired`
deletes more.

Vector search is exact (brute-force cosine) over the user's vectors, read from the file
once into an in-process float32 matrix (:mod:`tiermem.longterm.vector_cache`) and reused
by the user's next queries until this index writes for them or the TTL passes.

The index shares the file's worker thread and connection with the stores of this process
on the same file (:class:`~tiermem.store.backends.sqlite._connection.SQLiteDatabase`): its
writes join the durable store's group commits instead of taking turns at the write lock,
and only a small upsert (a few tens of turns' documents, in writes of at most
:data:`_DIRECT_DOCS`) may run directly on the caller's thread when the file is idle,
holding its event loop for a fraction of a millisecond at a time; larger work never blocks
the event loop. An upsert adds to each user's
statistics once per transaction, not once per document. Its migrations run on that
connection before its first operation; opening the connection applies the store's: either
may open a new file first. A document written again with the same terms (a summary's
chunks, rewritten on every pass with new dates) keeps its full-text row: only its kind,
dates and vector are rewritten.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sqlite3
from collections import Counter
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from itertools import chain, repeat, starmap
from typing import cast

from tiermem.clock import Clock, SystemClock
from tiermem.errors import BackendError
from tiermem.longterm.index import (
    DEFAULT_COLLECT_LIMIT,
    DocKind,
    IndexedDoc,
    SearchHit,
    SearchIndex,
    terms_of,
)
from tiermem.longterm.index_memory import (
    DocLoader,
    WarmingIndex,
    check_collect_limit,
    check_docs,
    check_search_args,
    collect_budget,
)
from tiermem.longterm.text import bm25_idf, bm25_term, query_terms
from tiermem.longterm.vector_cache import UserVectors, VectorCache, VectorRow, VectorWrite
from tiermem.longterm.vectors import pack_vector, unit_vector
from tiermem.store.backends.sqlite._connection import (
    DEFAULT_BUSY_TIMEOUT,
    SQLiteDatabase,
    from_epoch_us,
    to_epoch_us,
)
from tiermem.store.keys import validate_id

__all__ = ["INDEX_COMPONENT", "INDEX_MIGRATIONS", "SQLiteIndex", "apply_index_migrations"]

logger = logging.getLogger(__name__)

INDEX_COMPONENT = "recall_index"

INDEX_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE recall_docs (
            id            INTEGER PRIMARY KEY,
            user_id       TEXT NOT NULL,
            doc_id        TEXT NOT NULL,
            kind          TEXT NOT NULL,
            length        INTEGER NOT NULL,
            created_at_us INTEGER NOT NULL,
            UNIQUE (user_id, doc_id)
        )""",
        """CREATE TABLE recall_users (
            user_id      TEXT PRIMARY KEY,
            docs         INTEGER NOT NULL,
            total_length INTEGER NOT NULL
        ) WITHOUT ROWID""",
        # detail=column: column filters need it; positions (phrase queries) are never used.
        """CREATE VIRTUAL TABLE recall_fts USING fts5 (
            tokens, owner, tokenize = 'unicode61 remove_diacritics 0', detail = column
        )""",
        """CREATE TABLE recall_vectors (
            id      INTEGER PRIMARY KEY,
            user_id TEXT NOT NULL,
            dims    INTEGER NOT NULL,
            vector  BLOB NOT NULL
        )""",
        "CREATE INDEX recall_vectors_by_user ON recall_vectors (user_id)",
    ),
    (
        "ALTER TABLE recall_docs ADD COLUMN expires_at_us INTEGER",
        # Partial: only expiring documents (archived turns) are in it, and collection
        # reads it from the earliest expiry on.
        "CREATE INDEX recall_docs_by_expiry ON recall_docs (expires_at_us) "
        "WHERE expires_at_us IS NOT NULL",
    ),
    (
        # The tokens move into recall_docs and the FTS5 table goes (module docstring).
        # A process still running older code on the file fails its index writes (no
        # recall_fts) until it is restarted; one opening the file refuses the newer schema.
        "ALTER TABLE recall_docs ADD COLUMN tokens TEXT NOT NULL DEFAULT ''",
        "UPDATE recall_docs SET tokens = coalesce("
        "(SELECT f.tokens FROM recall_fts AS f WHERE f.rowid = recall_docs.id), '')",
        "DROP TABLE recall_fts",
    ),
)
"""Migration n of the index is ``INDEX_MIGRATIONS[n - 1]``; append-only, like the store's."""

_INSERT_BATCH = 500
"""Documents per write transaction: a warm-up of thousands never holds the lock for long."""

_DIRECT_DOCS = 16
"""Documents one direct write of an upsert holds, on the caller's thread, when the file is
idle (:meth:`~tiermem.store.backends.sqlite._connection.SQLiteDatabase.write`): a turn's
or a few turns' documents, about 20 µs each plus the commit. Handing them to the worker
thread instead cost more CPU than writing them (the hand-off, and the caller's caches gone
cold by the time it resumes)."""
_DIRECT_WRITES = 2
"""Direct writes an upsert may take (each at most :data:`_DIRECT_DOCS` documents, the
event loop served between them); larger upserts go to the thread, in one transaction (so
with many sessions writing at once, whose turns' documents come by the fifty, nothing
changes). The background queue gathers the documents of the turns of a few milliseconds
into one upsert: one session writing turn after turn gave 15-25, which as one write went
to the thread, costing more CPU than writing them directly in two (the hand-off, and the
GIL passed to and fro while the thread writes: about 600 µs of the thread's CPU per
upsert, ``bench/turns.py``), and held the file's write lock meanwhile, which sent the
next append to the thread too."""

_KEYS_PER_STATEMENT = 256
"""Documents one lookup of stored copies names at most (two parameters each, padded to a
power of two: under SQLite's historical limit of 999 parameters)."""
_USERS_PER_STATEMENT = 256
"""Users one update of the statistics names at most (three parameters each)."""

_Row = tuple[IndexedDoc, str, int, bytes | None, int, int, int | None]
"""doc, space-separated tokens, length, packed unit vector, dimensions, created_at µs,
expires_at µs."""
_Held = tuple[int, int, str]
"""A stored document's row id, length and tokens."""


def apply_index_migrations(conn: sqlite3.Connection, *, path: str) -> list[int]:
    """Bring the index tables up to the latest migration; return the migrations applied.

    ``conn`` must be in autocommit mode. All pending migrations run in one transaction,
    after taking the write lock, so concurrent openers migrate a file once.

    Raises:
        BackendError: the file's index tables were written by a newer tiermem.
        sqlite3.Error: SQLite failed (mapped by the caller).
    """
    target = len(INDEX_MIGRATIONS)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions ("
            "component TEXT PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID"
        )
        row = conn.execute(
            "SELECT version FROM schema_versions WHERE component = ?", (INDEX_COMPONENT,)
        ).fetchone()
        current = 0 if row is None else int(row[0])
        if current > target:
            raise BackendError(
                f"SQLite file {path} has recall index schema version {current}, but this "
                f"tiermem knows only up to {target}. Upgrade tiermem, or use another file.",
                backend="sqlite",
            )
        applied = list(range(current + 1, target + 1))
        for number in applied:
            for statement in INDEX_MIGRATIONS[number - 1]:
                conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_versions (component, version) VALUES (?, ?) "
            "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
            (INDEX_COMPONENT, target),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise
    if applied:
        logger.info("applied recall index migrations %s to %s", applied, path)
    return applied


def _set_up_index(conn: sqlite3.Connection, path: str) -> None:
    """The index's setup on the file's shared connection: its own migrations (the store's
    ran when the connection opened)."""
    apply_index_migrations(conn, path=path)


def _owner_token(user_id: str) -> str:
    """The ``owner`` token ``recall_fts`` rows held before migration 3 (for tests that
    write files as older code did)."""
    return "u" + hashlib.sha256(user_id.encode()).hexdigest()[:32]


DEFAULT_CACHE_USERS = 16
"""Users whose postings :class:`SQLiteIndex` keeps in process for BM25 search."""
DEFAULT_CACHE_TTL = timedelta(minutes=5)
"""How long a cached user is served before being read again from the file."""


class _SearchCache:
    """BM25 search from process memory for the recently queried users of a SQLiteIndex.

    Why: a search of the file returns every matching row with its tokens, and term
    frequencies are counted in Python: ~25 ms for a broad query over 10,000 documents. An
    in-process posting list (:class:`~tiermem.longterm.index_memory.InProcessIndex`, same
    BM25, same scores) answers in a few. A user is loaded from the file (one query) on
    their first search; this index's writes are applied to it as they happen; at most
    ``max_users`` stay (least recently searched evicted), and each is reloaded after
    ``ttl``, so writes made by another process on the same file are seen within ``ttl``.
    """

    def __init__(
        self,
        loader: DocLoader,
        max_users: int,
        ttl: timedelta,
        clock: Clock,
    ) -> None:
        self.index = WarmingIndex([loader], max_users=max_users, clock=clock)
        self._ttl = ttl
        self._clock = clock
        self._loaded_at: dict[str, datetime] = {}

    async def search(
        self, user_id: str, query: str, *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        now = self._clock.now()
        loaded = self._loaded_at.get(user_id)
        if loaded is not None and (now - loaded >= self._ttl or not self.index.is_warm(user_id)):
            await self.index.purge_user(user_id)
            loaded = None
        if loaded is None:
            self._loaded_at[user_id] = now
            if len(self._loaded_at) > 4 * self.index.max_users:
                self._loaded_at = {
                    u: t for u, t in self._loaded_at.items() if self.index.is_warm(u)
                }
        return await self.index.search(user_id, query, kinds=kinds, limit=limit)


class SQLiteIndex:
    """BM25 over pre-tokenized text and cosine over float32 blobs, in a SQLite file.

    ``path`` is normally the durable store's file (``SQLiteDurableStore(path)``); the index
    keeps its own tables there. Costs per query: one read of the user's rows that contain
    any query term, with their tokens (term frequencies are counted in Python);
    vector search reads all the user's vectors of the asked kinds.

    Raises (every method): :class:`~tiermem.errors.ValidationError` for bad ids, kinds or
    limits; :class:`~tiermem.errors.BackendTimeoutError` when another connection holds the
    write lock past ``busy_timeout``; :class:`~tiermem.errors.BackendError` when SQLite fails.
    """

    name = "sqlite"
    supports_vectors = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: timedelta = DEFAULT_BUSY_TIMEOUT,
        clock: Clock | None = None,
        cache_users: int = DEFAULT_CACHE_USERS,
        cache_ttl: timedelta = DEFAULT_CACHE_TTL,
    ) -> None:
        self._db = SQLiteDatabase(
            path, role="index", busy_timeout=busy_timeout, setup=_set_up_index
        )
        self._clock: Clock = clock or SystemClock()
        # BM25 search cache: the postings of the most recently queried users, in process
        # (see _SearchCache). 0 users: every search reads the file.
        self._cache = (
            _SearchCache(self._load_user, cache_users, cache_ttl, self._clock)
            if cache_users > 0
            else None
        )
        # Vector search cache (see VectorCache); 0 users: every vector search reads the file.
        self._vectors = (
            VectorCache(cache_users, cache_ttl, self._clock) if cache_users > 0 else None
        )

    @property
    def path(self) -> str:
        return self._db.path

    async def upsert(self, docs: Sequence[IndexedDoc]) -> None:
        check_docs(docs)
        if not docs:
            return
        rows: list[_Row] = []
        for doc in docs:
            counts = terms_of(doc)
            length = sum(counts.values())
            # Each term as many times as it occurs, in order (iterated in C); most texts
            # name each term once: then the terms as they are.
            if length == len(counts):
                tokens = " ".join(counts)
            else:
                tokens = " ".join(chain.from_iterable(starmap(repeat, counts.items())))
            vector = unit_vector(doc.embedding) if doc.embedding else None
            rows.append(
                (
                    doc,
                    tokens,
                    length,
                    None if vector is None else pack_vector(vector),
                    0 if vector is None else len(vector),
                    to_epoch_us(doc.created_at, what="created_at"),
                    None
                    if doc.expires_at is None
                    else to_epoch_us(doc.expires_at, what="expires_at"),
                )
            )
        now_us = to_epoch_us(self._clock.now(), what="now")

        def op(conn: sqlite3.Connection, chunk: list[_Row]) -> None:
            # Each user's statistics take one upsert per chunk, not one per document;
            # written before anything that reads or lowers them (a delete, collection).
            added: dict[str, list[int]] = {}
            # Every stored copy the chunk may replace, looked up at once; then kept up to
            # date as the chunk writes, for a document that comes twice.
            held_docs = _held_docs(conn, chunk)
            for doc, tokens, length, blob, dims, created_us, expires_us in chunk:
                key = (doc.user_id, doc.doc_id)
                held = held_docs.get(key)
                expired = expires_us is not None and expires_us <= now_us
                if held is not None and held[2] == tokens and not expired:
                    # The same terms (a summary's chunks are written again on every pass
                    # with new dates only): the row stays (its id, so its vector's too);
                    # the rest is rewritten.
                    _refresh_doc(conn, held[0], doc, created_us, expires_us, blob, dims)
                    continue
                if held is not None:
                    _add_to_users(conn, added)
                    _delete_row(conn, doc.user_id, held[0], held[1])
                    del held_docs[key]
                if expired:
                    continue  # expired already: removing the old version is all there is
                cursor = conn.execute(
                    "INSERT INTO recall_docs "
                    "(user_id, doc_id, kind, length, created_at_us, expires_at_us, tokens) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (doc.user_id, doc.doc_id, doc.kind, length, created_us, expires_us, tokens),
                )
                rowid = cursor.lastrowid
                if blob is not None:
                    conn.execute(
                        "INSERT INTO recall_vectors (id, user_id, dims, vector) "
                        "VALUES (?, ?, ?, ?)",
                        (rowid, doc.user_id, dims, blob),
                    )
                counts = added.setdefault(doc.user_id, [0, 0])
                counts[0] += 1
                counts[1] += length
                if rowid is not None:  # None only if SQLite gave no row id
                    held_docs[key] = (rowid, length, tokens)
            _add_to_users(conn, added)
            _collect(conn, now_us, collect_budget(len(chunk)))

        for chunk, direct in _chunks(rows):
            await self._db.write(functools.partial(op, chunk=chunk), direct=direct)
        if self._vectors is not None:
            _apply_vector_writes(self._vectors, rows)
        if self._cache is not None:
            self._cache.index.upsert_checked(docs)  # checked above

    async def collect_expired(self, limit: int = DEFAULT_COLLECT_LIMIT) -> int:
        check_collect_limit(limit)
        now_us = to_epoch_us(self._clock.now(), what="now")
        removed = 0
        while removed < limit:
            want = min(_INSERT_BATCH, limit - removed)
            done = await self._db.write(functools.partial(_collect, now_us=now_us, limit=want))
            removed += done
            if done < want:
                break
        return removed

    async def remove(self, user_id: str, doc_ids: Collection[str]) -> None:
        validate_id(user_id, what="user_id")
        ids = list(doc_ids)
        if not ids:
            return

        def op(conn: sqlite3.Connection) -> None:
            for doc_id in ids:
                _delete_doc(conn, user_id, doc_id)

        await self._db.write(op)
        if self._vectors is not None:
            self._vectors.apply(user_id, [(doc_id, "", None, 0, None) for doc_id in ids])
        if self._cache is not None:
            await self._cache.index.remove(user_id, ids)

    async def search(
        self, user_id: str, query: str, *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        check_search_args(user_id, kinds, limit)
        if self._cache is not None:
            return await self._cache.search(user_id, query, kinds=kinds, limit=limit)
        return await self._search_file(user_id, query, kinds=kinds, limit=limit)

    async def _load_user(self, user_id: str) -> list[IndexedDoc]:
        """Every indexed document of the user, as terms (no text), for the search cache."""

        def op(conn: sqlite3.Connection) -> list[tuple[str, str, str, int, int | None]]:
            return conn.execute(
                "SELECT doc_id, kind, tokens, created_at_us, expires_at_us "
                "FROM recall_docs WHERE user_id = ?",
                (user_id,),
            ).fetchall()

        rows = await self._db.read(op)
        return [
            IndexedDoc(
                user_id=user_id,
                doc_id=doc_id,
                kind=cast("DocKind", kind),
                text="",
                created_at=from_epoch_us(created_us),
                expires_at=None if expires_us is None else from_epoch_us(expires_us),
                terms=dict(Counter(tokens.split(" "))) if tokens else {},
            )
            for doc_id, kind, tokens, created_us, expires_us in rows
        ]

    async def _search_file(
        self, user_id: str, query: str, *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        terms = query_terms(query)
        wanted = sorted(set(kinds))
        if not terms or not wanted:
            return []
        # A row holds a term when its space-separated tokens, padded with a space on each
        # side, contain the term so padded (terms hold no spaces): the rows FTS5 matched.
        # Only placeholders are joined into the statement.
        holds = " OR ".join(["instr(' ' || tokens || ' ', ?) > 0"] * len(terms))
        now_us = to_epoch_us(self._clock.now(), what="now")

        def op(conn: sqlite3.Connection) -> list[SearchHit]:
            stats = conn.execute(
                "SELECT docs, total_length FROM recall_users WHERE user_id = ?", (user_id,)
            ).fetchone()
            if stats is None or stats[0] <= 0:
                return []
            count, average = int(stats[0]), stats[1] / stats[0]
            # Expired rows are read too: they count in df until collected, as in every
            # index (see tiermem.longterm.index), and _rank leaves them out of the hits.
            rows = conn.execute(
                "SELECT doc_id, kind, length, tokens, "  # noqa: S608 -- see above
                "expires_at_us IS NOT NULL AND expires_at_us <= ? "
                f"FROM recall_docs WHERE user_id = ? AND ({holds})",
                (now_us, user_id, *[f" {term} " for term in terms]),
            ).fetchall()
            return _rank(rows, terms, wanted, count, average, limit)

        return await self._db.read(op)

    async def vector_search(
        self, user_id: str, vector: Sequence[float], *, kinds: Collection[DocKind], limit: int
    ) -> list[SearchHit]:
        check_search_args(user_id, kinds, limit)
        if not kinds or not vector:
            return []
        dims = len(vector)
        now_us = to_epoch_us(self._clock.now(), what="now")
        cache = self._vectors
        found = cache.get(user_id, dims) if cache is not None else None
        if found is None:
            loaded_at = self._clock.now()

            def op(conn: sqlite3.Connection) -> list[VectorRow]:
                # Every kind and expired rows too: the matrix serves any kinds and masks
                # expiries per query, so it stays valid as documents expire.
                return conn.execute(
                    "SELECT d.doc_id, d.kind, v.vector, d.expires_at_us FROM recall_vectors AS v "
                    "CROSS JOIN recall_docs AS d ON d.id = v.id "
                    "WHERE v.user_id = ? AND v.dims = ?",
                    (user_id, dims),
                ).fetchall()

            if cache is None:
                found = UserVectors(await self._db.read(op), dims)
            else:
                # Not kept if this index writes for the user during the read (see
                # VectorCache.begin_load).
                cache.begin_load(user_id)
                try:
                    found = UserVectors(await self._db.read(op), dims)
                finally:
                    cache.end_load(user_id, found, loaded_at)
        return [
            SearchHit(doc_id=doc_id, kind=cast("DocKind", kind), score=score)
            for doc_id, kind, score in found.top(vector, kinds, now_us, limit)
        ]

    async def purge_user(self, user_id: str) -> None:
        validate_id(user_id, what="user_id")

        def op(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM recall_vectors WHERE user_id = ?", (user_id,))
            conn.execute("DELETE FROM recall_docs WHERE user_id = ?", (user_id,))
            conn.execute("DELETE FROM recall_users WHERE user_id = ?", (user_id,))

        await self._db.write(op)
        if self._vectors is not None:
            self._vectors.drop_users({user_id})
        if self._cache is not None:
            await self._cache.index.purge_user(user_id)

    async def aclose(self) -> None:
        if self._cache is not None:
            await self._cache.index.aclose()
        await self._db.aclose()


def _chunks(rows: list[_Row]) -> list[tuple[list[_Row], bool]]:
    """An upsert's write transactions, each with whether it may run directly: up to
    :data:`_DIRECT_WRITES` direct ones of at most :data:`_DIRECT_DOCS` documents (of even
    sizes), else thread ones of :data:`_INSERT_BATCH`."""
    writes = -(-len(rows) // _DIRECT_DOCS)
    direct = writes <= _DIRECT_WRITES
    size = -(-len(rows) // writes) if direct else _INSERT_BATCH
    return [(rows[start : start + size], direct) for start in range(0, len(rows), size)]


def _add_to_users(conn: sqlite3.Connection, added: dict[str, list[int]]) -> None:
    """Add the documents and lengths counted in ``added`` (user → [docs, length]) to the
    users' statistics, and empty it: one statement for every user (a chunk written on the
    worker thread holds the turns of many sessions, so of many users), not one each."""
    if not added:
        return
    users = list(added.items())
    for start in range(0, len(users), _USERS_PER_STATEMENT):
        group = users[start : start + _USERS_PER_STATEMENT]
        values = ", ".join(["(?, ?, ?)"] * len(group))
        # Only placeholders are joined into the statement. "WHERE true" keeps the parser
        # from reading ON CONFLICT as part of the SELECT's join.
        conn.execute(
            "INSERT INTO recall_users (user_id, docs, total_length) "  # noqa: S608
            f"SELECT column1, column2, column3 FROM (VALUES {values}) "
            "WHERE true ON CONFLICT (user_id) DO UPDATE SET docs = docs + excluded.docs, "
            "total_length = total_length + excluded.total_length",
            [value for user_id, (docs, length) in group for value in (user_id, docs, length)],
        )
    added.clear()


def _apply_vector_writes(cache: VectorCache, rows: Sequence[_Row]) -> None:
    """Apply an upsert's written documents to the cached vectors of their users."""
    by_user: dict[str, list[VectorWrite]] = {}
    for doc, _, _, blob, dims, _, expires_us in rows:
        by_user.setdefault(doc.user_id, []).append((doc.doc_id, doc.kind, blob, dims, expires_us))
    for user_id, writes in by_user.items():
        cache.apply(user_id, writes)


def _held_docs(conn: sqlite3.Connection, chunk: Sequence[_Row]) -> dict[tuple[str, str], _Held]:
    """The stored copies of the chunk's documents, by (user id, doc id): one statement for
    up to :data:`_KEYS_PER_STATEMENT` documents of any users (a chunk written on the worker
    thread holds many sessions' turns, so many users), not one per user or document."""
    keys = list(dict.fromkeys((row[0].user_id, row[0].doc_id) for row in chunk))
    held: dict[tuple[str, str], _Held] = {}
    for start in range(0, len(keys), _KEYS_PER_STATEMENT):
        group = keys[start : start + _KEYS_PER_STATEMENT]
        # Padded to a power of two (repeating a key) so that a few statement texts serve
        # every chunk size; only placeholders are joined into it. CROSS JOIN fixes the
        # loop order: each wanted key, then its document by the (user_id, doc_id) index.
        size = 1 << (len(group) - 1).bit_length()
        bound = group + group[-1:] * (size - len(group))
        rows = conn.execute(
            "SELECT w.column1, w.column2, d.id, d.length, d.tokens "  # noqa: S608
            f"FROM (VALUES {', '.join(['(?, ?)'] * size)}) AS w "
            "CROSS JOIN recall_docs AS d ON d.user_id = w.column1 AND d.doc_id = w.column2",
            [part for key in bound for part in key],
        )
        for user_id, doc_id, rowid, length, tokens in rows:
            held[(user_id, doc_id)] = (int(rowid), int(length), str(tokens))
    return held


def _refresh_doc(
    conn: sqlite3.Connection,
    rowid: int,
    doc: IndexedDoc,
    created_us: int,
    expires_us: int | None,
    blob: bytes | None,
    dims: int,
) -> None:
    """Rewrite what a document holds besides its terms (which are unchanged): its kind,
    dates and vector."""
    conn.execute(
        "UPDATE recall_docs SET kind = ?, created_at_us = ?, expires_at_us = ? WHERE id = ?",
        (doc.kind, created_us, expires_us, rowid),
    )
    conn.execute("DELETE FROM recall_vectors WHERE id = ?", (rowid,))
    if blob is not None:
        conn.execute(
            "INSERT INTO recall_vectors (id, user_id, dims, vector) VALUES (?, ?, ?, ?)",
            (rowid, doc.user_id, dims, blob),
        )


def _delete_doc(conn: sqlite3.Connection, user_id: str, doc_id: str) -> None:
    row = conn.execute(
        "SELECT id, length FROM recall_docs WHERE user_id = ? AND doc_id = ?", (user_id, doc_id)
    ).fetchone()
    if row is not None:
        _delete_row(conn, user_id, row[0], row[1])


def _delete_row(conn: sqlite3.Connection, user_id: str, rowid: int, length: int) -> None:
    conn.execute("DELETE FROM recall_vectors WHERE id = ?", (rowid,))
    conn.execute("DELETE FROM recall_docs WHERE id = ?", (rowid,))
    conn.execute(
        "UPDATE recall_users SET docs = docs - 1, total_length = total_length - ? "
        "WHERE user_id = ?",
        (length, user_id),
    )
    # A user whose last document went leaves no row behind.
    conn.execute("DELETE FROM recall_users WHERE user_id = ? AND docs <= 0", (user_id,))


def _collect(conn: sqlite3.Connection, now_us: int, limit: int) -> int:
    """Delete up to ``limit`` expired documents of any user, earliest expiry first; return
    how many. Reads the partial index ``recall_docs_by_expiry`` from its start."""
    rows = conn.execute(
        "SELECT user_id, doc_id FROM recall_docs WHERE expires_at_us <= ? "
        "ORDER BY expires_at_us LIMIT ?",
        (now_us, limit),
    ).fetchall()
    for user_id, doc_id in rows:
        _delete_doc(conn, user_id, doc_id)
    return len(rows)


def _rank(
    rows: list[tuple[str, DocKind, int, str, int]],
    terms: list[str],
    kinds: Collection[DocKind],
    count: int,
    average: float,
    limit: int,
) -> list[SearchHit]:
    """BM25 of the matched rows, the in-process index's way (same formula, same order).
    A row holding none of the terms (none is read: see :meth:`SQLiteIndex._search_file`)
    would be no hit."""
    wanted = set(terms)
    frequencies: list[dict[str, int]] = []
    df = dict.fromkeys(terms, 0)
    for _, _, _, tokens, _ in rows:
        tf: dict[str, int] = {}
        for token in tokens.split(" "):
            if token in wanted:
                tf[token] = tf.get(token, 0) + 1
        for term in tf:
            df[term] += 1
        frequencies.append(tf)
    idf = {term: bm25_idf(count, df[term]) for term in terms if df[term]}
    allowed = set(kinds)
    scored: list[tuple[str, DocKind, float]] = []
    for (doc_id, kind, length, _, expired), tf in zip(rows, frequencies, strict=True):
        if kind not in allowed or expired or not tf:
            continue
        score = 0.0
        for term in terms:
            if term in tf:
                score += bm25_term(idf[term], tf[term], length, average)
        scored.append((doc_id, kind, score))
    scored.sort(key=lambda item: (-item[2], item[0]))
    return [
        SearchHit(doc_id=doc_id, kind=kind, score=score) for doc_id, kind, score in scored[:limit]
    ]


def _check_protocol() -> SearchIndex:  # pragma: no cover - typing only
    return SQLiteIndex("unused.db")
