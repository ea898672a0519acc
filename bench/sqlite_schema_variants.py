"""What the ``turns`` table's layout costs a durable append (issue #8, session 13).

Runs ``--appends`` appends of one session with the statements
:meth:`~tiermem.store.backends.sqlite.SQLiteDurableStore.append_turns` runs (``BEGIN
IMMEDIATE``, the header read, the turn's insert, the header upsert, ``COMMIT``; a passive
checkpoint every 256, as direct writes get) on a file migrated by the store, then changed
to one layout:

* ``base``: the store's schema (a rowid table, its ``(session_id, idx)`` primary-key
  index and the partial ``turns_by_expiry`` index);
* ``without_rowid``: ``turns`` clustered by ``(session_id, idx)`` (``WITHOUT ROWID``,
  ``expires_at_us`` before the payload), the expiry index kept;
* ``no_expiry_index``: the store's table without ``turns_by_expiry``;
* ``without_rowid_no_expiry_index``: both.

Nothing but the statements runs, so under callgrind the difference of two runs divided by
the difference of their appends is the instructions of one append; under ``strace -c -f
-e trace=pwrite64`` the same difference gives the WAL writes (two per page)::

    valgrind --tool=callgrind .venv/bin/python bench/sqlite_schema_variants.py base 200
    valgrind --tool=callgrind .venv/bin/python bench/sqlite_schema_variants.py base 1200

Measured (SQLite 3.40.1, 300-character turns; instructions and ``pwrite64`` calls per
append, (1,200 − 200) / 1,000): base 114.2k, 9.10 writes; without_rowid 112.4k (−1.6 %),
9.01 writes (an index b-tree appended to in order rebalances its rightmost pages, so the
page saved by dropping the separate primary-key index comes back in splits);
no_expiry_index 103.3k (−9.5 %), 6.94 writes; both 100.9k, 6.54 writes. With
2,000-character turns base costs 139.4k. So clustering does not pay for a migration; the
expiry index is about a tenth of the append and one WAL page, but the collection of
expired turns in live sessions needs it (see docs/decisions.md).
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
from datetime import timedelta
from pathlib import Path

from tiermem.store.backends.sqlite._open import open_worker_connection

VARIANTS = ("base", "without_rowid", "no_expiry_index", "without_rowid_no_expiry_index")
NOW_US = 1_700_000_000_000_000
EXPIRES_US = NOW_US + 86_400_000_000
SESSION = "01M84Y7EC5A8H1DKB0G78YFEZN"
CHECKPOINT_EVERY = 256
READ = (
    "SELECT s.next_index, s.expires_at_us, k.first_index, k.turn_count FROM sessions AS s "
    "LEFT JOIN idempotency_keys AS k ON k.session_id = s.session_id "
    "AND k.idempotency_key = ? WHERE s.session_id = ?"
)
INSERT = "INSERT INTO turns (session_id, idx, payload, expires_at_us) VALUES (?, ?, ?, ?)"
UPSERT = (
    "INSERT INTO sessions (session_id, next_index, expires_at_us, collect_at_us) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
    "next_index = excluded.next_index, expires_at_us = excluded.expires_at_us"
)


def _layout(conn: sqlite3.Connection, variant: str) -> None:
    if variant.startswith("without_rowid"):
        conn.execute("DROP TABLE turns")
        conn.execute(
            "CREATE TABLE turns (session_id TEXT NOT NULL, idx INTEGER NOT NULL, "
            "expires_at_us INTEGER, payload TEXT NOT NULL, PRIMARY KEY (session_id, idx)) "
            "WITHOUT ROWID"
        )
        if variant == "without_rowid":
            conn.execute(
                "CREATE INDEX turns_by_expiry ON turns (expires_at_us) "
                "WHERE expires_at_us IS NOT NULL"
            )
    elif variant == "no_expiry_index":
        conn.execute("DROP INDEX turns_by_expiry")


def run(variant: str, appends: int, chars: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        conn = open_worker_connection(str(Path(tmp) / "v.db"), timedelta(seconds=5), "NORMAL")
        try:
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # as the direct writes run
            _layout(conn, variant)
            body = "x" * chars
            for i in range(appends):
                conn.execute("BEGIN IMMEDIATE")
                row = conn.execute(READ, (None, SESSION)).fetchone()
                start = 0 if row is None else int(row[0])
                payload = f'{{"role":"user","content":"{body}","index":{start}}}'
                conn.executemany(INSERT, [(SESSION, start, payload, EXPIRES_US + i)])
                conn.execute(UPSERT, (SESSION, start + 1, EXPIRES_US + i, EXPIRES_US + i))
                conn.execute("COMMIT")
                if i % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("appends", type=int)
    parser.add_argument("--chars", type=int, default=300, help="characters of each turn's text")
    args = parser.parse_args()
    run(args.variant, args.appends, args.chars)


if __name__ == "__main__":
    main()
