"""The SQLite schema as an ordered list of migrations, and the code that applies them.

Migration ``n`` (1-based) brings a file from ``PRAGMA user_version`` ``n - 1`` to ``n``.
Migrations are append-only: a released one is never edited, a change is a new entry.
Statements carry no ``IF NOT EXISTS`` on purpose, so applying one twice fails loudly
instead of hiding a bookkeeping bug.

Hot and durable tables share one list: both stores may open the same file, and whichever
opens first migrates it. Opening takes the write lock (``BEGIN IMMEDIATE``) before reading
``user_version``, so two processes opening a new file at once migrate it exactly once.
"""

from __future__ import annotations

import logging
import sqlite3

from tiermem.errors import BackendError

__all__ = ["MIGRATIONS", "apply_migrations", "schema_version"]

logger = logging.getLogger(__name__)

_V1_FTS_TOKENIZER = "trigram" if sqlite3.sqlite_version_info >= (3, 34, 0) else "unicode61"
"""The tokenizer migration 1 gave ``memories_fts``; kept so that migration 1 stays as
released. Migration 2 drops the table: recall searches
:class:`~tiermem.longterm.index_sqlite.SQLiteIndex`'s own tables instead."""

_V1_HOT = (
    # version counts writes; next_index allocates turn indexes; metadata is JSON or NULL.
    """CREATE TABLE hot_sessions (
        session_id    TEXT PRIMARY KEY,
        version       INTEGER NOT NULL,
        next_index    INTEGER NOT NULL,
        expires_at_us INTEGER NOT NULL,
        metadata      TEXT
    ) WITHOUT ROWID""",
    "CREATE INDEX hot_sessions_by_expiry ON hot_sessions (expires_at_us)",
    # Turns hold whole JSON documents (often kilobytes), so they live in rowid tables:
    # WITHOUT ROWID suits rows smaller than about 1/20 of a page.
    """CREATE TABLE hot_turns (
        session_id TEXT NOT NULL,
        idx        INTEGER NOT NULL,
        payload    TEXT NOT NULL,
        PRIMARY KEY (session_id, idx)
    )""",
    """CREATE TABLE hot_entities (
        session_id TEXT NOT NULL,
        kind       TEXT NOT NULL,
        payload    TEXT NOT NULL,
        PRIMARY KEY (session_id, kind)
    ) WITHOUT ROWID""",
    """CREATE TABLE hot_state (
        session_id TEXT NOT NULL,
        name       TEXT NOT NULL,
        version    INTEGER NOT NULL,
        payload    TEXT NOT NULL,
        PRIMARY KEY (session_id, name)
    )""",
    """CREATE TABLE activity (
        session_id     TEXT PRIMARY KEY,
        expires_at_us  INTEGER NOT NULL,
        lease_owner    TEXT,
        lease_until_us INTEGER
    ) WITHOUT ROWID""",
    "CREATE INDEX activity_by_expiry ON activity (expires_at_us)",
)

_V1_DURABLE = (
    # The archive's next index lives apart from the turns, so collecting expired turns
    # never lets a slot be reused.
    """CREATE TABLE archive_heads (
        session_id TEXT PRIMARY KEY,
        next_index INTEGER NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE turns (
        session_id    TEXT NOT NULL,
        idx           INTEGER NOT NULL,
        payload       TEXT NOT NULL,
        expires_at_us INTEGER,
        PRIMARY KEY (session_id, idx)
    )""",
    # Partial: only turns with a retention are ever collected.
    "CREATE INDEX turns_by_expiry ON turns (expires_at_us) WHERE expires_at_us IS NOT NULL",
    """CREATE TABLE session_records (
        session_id    TEXT NOT NULL,
        kind          TEXT NOT NULL,
        version       INTEGER NOT NULL,
        payload       TEXT NOT NULL,
        expires_at_us INTEGER,
        PRIMARY KEY (session_id, kind)
    )""",
    "CREATE INDEX session_records_by_expiry ON session_records (expires_at_us) "
    "WHERE expires_at_us IS NOT NULL",
    """CREATE TABLE user_sessions (
        user_id       TEXT NOT NULL,
        session_id    TEXT NOT NULL,
        created_at_us INTEGER NOT NULL,
        payload       TEXT NOT NULL,
        PRIMARY KEY (user_id, session_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX user_sessions_newest ON user_sessions (user_id, created_at_us, session_id)",
    "CREATE INDEX user_sessions_by_session ON user_sessions (session_id)",
    # A rowid table: memories_fts rows shared the memory's rowid, which kept the index in
    # sync with one indexed delete instead of a scan over UNINDEXED columns (until migration 2).
    """CREATE TABLE memories (
        user_id       TEXT NOT NULL,
        memory_id     TEXT NOT NULL,
        memory_type   TEXT NOT NULL,
        created_at_us INTEGER NOT NULL,
        expires_at_us INTEGER,
        version       INTEGER NOT NULL,
        payload       TEXT NOT NULL,
        PRIMARY KEY (user_id, memory_id)
    )""",
    "CREATE INDEX memories_by_type ON memories (user_id, memory_type, created_at_us)",
    "CREATE INDEX memories_newest ON memories (user_id, created_at_us)",
    f"""CREATE VIRTUAL TABLE memories_fts USING fts5 (
        content, tags, user_id UNINDEXED, memory_id UNINDEXED,
        tokenize = '{_V1_FTS_TOKENIZER}'
    )""",
)

_V2_DROP_MEMORIES_FTS = (
    # Recall searches SQLiteIndex's tables (word tokens and CJK bigrams), so this trigram
    # copy of every memory was written on each put and never read. The freed pages are
    # reused by later writes; VACUUM returns them to the file system.
    "DROP TABLE memories_fts",
)

_V3_SESSION_HEADERS = (
    # One header per durable session (issue #7): the archive's next index (which used to be
    # archive_heads), the owner and the lifetime, so that an append raises the lifetime and
    # moves the index in one upsert. NULL expires_at_us is forever; NULL user_id and ref
    # (the owner's SessionRef JSON) mean not registered. user_sessions stays each user's
    # list (their history), but it no longer decides who owns an id.
    """CREATE TABLE sessions (
        session_id    TEXT PRIMARY KEY,
        next_index    INTEGER NOT NULL,
        expires_at_us INTEGER,
        user_id       TEXT,
        created_at_us INTEGER,
        ref           TEXT
    ) WITHOUT ROWID""",
    # Partial: sessions that live forever are never collected.
    "CREATE INDEX sessions_by_expiry ON sessions (expires_at_us) WHERE expires_at_us IS NOT NULL",
    """CREATE TABLE idempotency_keys (
        session_id      TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        first_index     INTEGER NOT NULL,
        turn_count      INTEGER NOT NULL,
        PRIMARY KEY (session_id, idempotency_key)
    ) WITHOUT ROWID""",
    # Every session any table knows. The owner is its earliest registration; the lifetime
    # is the latest expiry of its turns and records (forever if any had none, or if it was
    # only registered: registrations never expired). A session whose turns were all
    # collected already, and which has no records, was dead: it gets lifetime 0.
    """INSERT INTO sessions (session_id, next_index, expires_at_us, user_id, created_at_us, ref)
    WITH ids (session_id) AS (
        SELECT session_id FROM archive_heads
        UNION SELECT session_id FROM user_sessions
        UNION SELECT session_id FROM session_records
    ),
    expiries (session_id, latest, forever) AS (
        SELECT session_id, max(expires_at_us), max(expires_at_us IS NULL)
        FROM (SELECT session_id, expires_at_us FROM turns
              UNION ALL SELECT session_id, expires_at_us FROM session_records)
        GROUP BY session_id
    ),
    owners AS (
        SELECT session_id, user_id, created_at_us, payload, row_number() OVER (
            PARTITION BY session_id ORDER BY created_at_us, user_id
        ) AS position
        FROM user_sessions
    )
    SELECT ids.session_id, coalesce(heads.next_index, 0),
        CASE WHEN expiries.forever THEN NULL
             WHEN expiries.latest IS NOT NULL THEN expiries.latest
             WHEN coalesce(heads.next_index, 0) > 0 THEN 0
             ELSE NULL END,
        owners.user_id, owners.created_at_us, owners.payload
    FROM ids
    LEFT JOIN archive_heads AS heads ON heads.session_id = ids.session_id
    LEFT JOIN expiries ON expiries.session_id = ids.session_id
    LEFT JOIN owners ON owners.session_id = ids.session_id AND owners.position = 1""",
    # Records now live as long as their session, so one that had expired on its own would
    # come back to life; drop those (by the wall clock: a migration has no injected one).
    "DELETE FROM session_records "
    "WHERE expires_at_us <= CAST(strftime('%s', 'now') AS INTEGER) * 1000000",
    # Rebuilt without expires_at_us (and its index), which no longer means anything;
    # a rebuild rather than DROP COLUMN, which needs SQLite 3.35.
    """CREATE TABLE session_records_v3 (
        session_id TEXT NOT NULL,
        kind       TEXT NOT NULL,
        version    INTEGER NOT NULL,
        payload    TEXT NOT NULL,
        PRIMARY KEY (session_id, kind)
    )""",
    "INSERT INTO session_records_v3 (session_id, kind, version, payload) "
    "SELECT session_id, kind, version, payload FROM session_records",
    "DROP TABLE session_records",
    "ALTER TABLE session_records_v3 RENAME TO session_records",
    "DROP TABLE archive_heads",
)

_V4_HOT_SHARED = (
    # The hot tier's shared keyspace (issue #11): named compare-and-set blobs that belong to
    # no session, such as circuit breakers. payload is the StateBlob's JSON; NULL
    # expires_at_us is forever.
    """CREATE TABLE hot_shared (
        name          TEXT PRIMARY KEY,
        version       INTEGER NOT NULL,
        expires_at_us INTEGER,
        payload       TEXT NOT NULL
    )""",
    # Partial: blobs that live forever are never collected.
    "CREATE INDEX hot_shared_by_expiry ON hot_shared (expires_at_us) "
    "WHERE expires_at_us IS NOT NULL",
)

_V5_SESSION_COLLECTION = (
    # Issue #8: an append raises its session's lifetime, and an index on expires_at_us
    # moved the session's entry in it on every append (one more page written per commit).
    # Collection finds dead sessions by collect_at_us instead: a lower bound of
    # expires_at_us (NULL only when it is NULL), which an append leaves alone since a live
    # session's lifetime only grows; the collector raises it when it finds the session
    # still alive (see SQLiteDurableStore._collect_garbage).
    "ALTER TABLE sessions ADD COLUMN collect_at_us INTEGER",
    "UPDATE sessions SET collect_at_us = expires_at_us",
    "DROP INDEX sessions_by_expiry",
    # Partial: sessions that live forever are never collected.
    "CREATE INDEX sessions_by_collection ON sessions (collect_at_us) "
    "WHERE collect_at_us IS NOT NULL",
    # A process still running older code (a rolling restart of workers sharing the file)
    # inserts headers without collect_at_us: give them their lifetime as the bound, or
    # they would never be collected. Only a real insert fires it (an upsert that updates
    # does not), and this code always sets the column, so the WHEN clause is all it costs.
    """CREATE TRIGGER sessions_collect_at_default AFTER INSERT ON sessions
    WHEN NEW.collect_at_us IS NULL AND NEW.expires_at_us IS NOT NULL
    BEGIN
        UPDATE sessions SET collect_at_us = NEW.expires_at_us
        WHERE session_id = NEW.session_id;
    END""",
)

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    _V1_HOT + _V1_DURABLE,
    _V2_DROP_MEMORIES_FTS,
    _V3_SESSION_HEADERS,
    _V4_HOT_SHARED,
    _V5_SESSION_COLLECTION,
)
"""Migration n is ``MIGRATIONS[n - 1]``: statements run in order, in one transaction."""


def schema_version(conn: sqlite3.Connection) -> int:
    """The migration a file is at (``PRAGMA user_version``; 0 for a new file)."""
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    return int(version)


def apply_migrations(conn: sqlite3.Connection, *, path: str) -> list[int]:
    """Bring the file up to the latest migration; return the migrations applied.

    ``conn`` must be in autocommit mode (``isolation_level=None``). All pending migrations
    run in one transaction: a failure leaves the file at its old version.

    Raises:
        BackendError: the file was written by a newer tiermem, or a migration failed.
        sqlite3.Error: the file could not be locked or read (mapped by the caller).
    """
    target = len(MIGRATIONS)
    if schema_version(conn) == target:  # the common case: no write lock needed
        return []
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = schema_version(conn)  # again, now that no other opener can race us
        if current > target:
            raise BackendError(
                f"SQLite file {path} is at schema version {current}, but this tiermem knows "
                f"only up to {target}. Upgrade tiermem, or point it at another file.",
                backend="sqlite",
            )
        applied = list(range(current + 1, target + 1))
        for number in applied:
            for statement in MIGRATIONS[number - 1]:
                conn.execute(statement)
        # PRAGMA takes no parameters; target is an int we computed.
        conn.execute(f"PRAGMA user_version = {int(target)}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise
    if applied:
        logger.info("applied SQLite migrations %s to %s", applied, path)
    return applied
