"""SQLite backend: the embedded default, both storage roles in one local file.

No server and no dependency beyond the standard library's :mod:`sqlite3`. The stores of a
process on one file (hot, durable, and recall's index) share one worker thread and its
connection, so slow work never holds the event loop; small operations (a turn's append, a
one-row read) run directly on the caller's thread when their store is idle, on a second
connection that never waits for a lock. The file runs in WAL mode (readers beside the one
writer), a busy timeout, and ``BEGIN IMMEDIATE`` for every write, so concurrent writers,
even in other processes, are serialized rather than lost. Writes queued together commit
together (group commit, each in its own savepoint, none acknowledged before the commit:
see :mod:`~tiermem.store.backends.sqlite._worker`). ``synchronous`` is ``NORMAL`` by
default (a commit survives a process crash, not a power loss) or ``FULL`` (both). The
schema is an ordered list of migrations tracked in ``PRAGMA user_version``
(:mod:`~tiermem.store.backends.sqlite._schema`).

A file path is required: ``":memory:"`` is refused, because the two stores each open
their own connection and an in-memory database cannot be shared between them. Use
:func:`default_database_path` for the per-user default.

Layout (every timestamp column is integer microseconds since the epoch, the exact value of
the datetime; the JSON ``payload`` is the pydantic model and is what reads return)::

    hot tier
    ├── hot_sessions   (session_id) → version, next_index, expires_at_us, metadata JSON
    ├── hot_turns      (session_id, idx) → Turn JSON            the last `window` turns
    ├── hot_entities   (session_id, kind) → ActiveEntity JSON
    ├── hot_state      (session_id, name) → version, StateBlob JSON
    └── activity       (session_id) → expires_at_us, lease_owner, lease_until_us
                       index: expires_at_us                      handoff claims
    durable tier
    ├── sessions       (session_id) → next_index (never reused), expires_at_us (the
    │                  lifetime; NULL forever), user_id, created_at_us, ref (the owner's
    │                  SessionRef JSON; NULL unregistered); index: expires_at_us
    ├── turns          (session_id, idx) → Turn JSON, expires_at_us
    ├── session_records (session_id, kind) → version, SessionRecord JSON   (live while
    │                  the session lives)
    ├── idempotency_keys (session_id, idempotency_key) → first_index, turn_count
    ├── user_sessions  (user_id, session_id) → created_at_us, SessionRef JSON  (each
    │                  user's list; the owner is the header's)
    │                  index: (user_id, created_at_us, session_id); (session_id)
    └── memories       (user_id, memory_id) → memory_type, created_at_us, expires_at_us,
                       version, MemoryRecord JSON; index: (user_id, memory_type,
                       created_at_us); (user_id, created_at_us)

Migration 3 folded ``archive_heads`` into ``sessions`` (owner: the earliest registration;
lifetime: the latest expiry of the session's turns and records) and dropped
``session_records.expires_at_us``: records live as long as their session.

Full-text search is not the store's: recall's
:class:`~tiermem.longterm.index_sqlite.SQLiteIndex` keeps its own tables in the same file
(migration 2 dropped the store's former ``memories_fts``).

Where things live (read in this order when something goes wrong): ``_hot`` and
``_durable`` are the stores and their statements; ``_connection`` is each store's handle on
the file, the per-process registry that shares one engine per file, and the direct runs on
the caller's thread; ``_worker`` is the file's worker thread (its queue, group commit with
savepoints); ``_checkpoint`` is the thread that checkpoints the WAL beside the writes;
``_mapping`` maps timestamps, sqlite3 errors and settings;
``_open`` opens the connections (every pragma); ``_schema`` holds the migrations and
``_paths`` the default file location.

Ids are bound as SQL parameters, never spliced into statements, so they need no escaping;
they are still validated with :func:`tiermem.store.keys.validate_id` before any I/O.
"""

from tiermem.store.backends.sqlite._durable import SQLiteDurableStore
from tiermem.store.backends.sqlite._hot import SQLiteHotStore
from tiermem.store.backends.sqlite._mapping import (
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_SYNCHRONOUS,
    Synchronous,
)
from tiermem.store.backends.sqlite._paths import default_data_dir, default_database_path
from tiermem.store.backends.sqlite._schema import MIGRATIONS

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "DEFAULT_SYNCHRONOUS",
    "MIGRATIONS",
    "SQLiteDurableStore",
    "SQLiteHotStore",
    "Synchronous",
    "default_data_dir",
    "default_database_path",
]
